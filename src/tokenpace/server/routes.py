"""The OpenAI-compatible endpoints: completions and chat completions, streaming or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from tokenpace.core.sampling import SamplingParams
from tokenpace.server.access import authorizer, check_model
from tokenpace.server.choices import Choice
from tokenpace.server.errors import ApiError, error_body
from tokenpace.server.events import Event
from tokenpace.server.output import OutputBuilder, OutputSpec
from tokenpace.server.prompts import chat_prompt_ids, completion_prompts, longest_prompt_chars
from tokenpace.server.responses import ResponseMeta
from tokenpace.server.sampling_fields import sampling_params
from tokenpace.server.schemas import (
    MAX_CHOICES,
    ChatCompletionRequest,
    CompletionRequest,
    _SamplingFields,
)
from tokenpace.server.service import Service
from tokenpace.server.streaming import ClientGone, collect_response, first_events, stream_events
from tokenpace.server.tokenizer_routes import build_tokenizer_router


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """HTTP-side settings. ``unix_clock`` stamps ``created`` (Unix seconds);
    ``stream_shutdown_grace_s``: how long open streams may run once shutdown begins (the
    drain ends them before that); ``max_request_bytes``: larger bodies get a 413;
    ``tokenizer_info``: serve ``GET /tokenizer_info``."""

    model_name: str
    api_key: str | None
    disconnect_poll_s: float
    unix_clock: Callable[[], float]
    stream_shutdown_grace_s: float = 30.0
    max_request_bytes: int = 4 * 2**20
    tokenizer_info: bool = False


def build_router(service: Service, config: RouteConfig) -> APIRouter:
    """The ``/v1`` routes bound to ``service``."""

    router = APIRouter(prefix="/v1", dependencies=[Depends(authorizer(config.api_key))])

    def output_spec(
        body: _SamplingFields, chat: bool, echo: tuple[int, ...] | None, echoed: str = ""
    ) -> OutputSpec:
        return OutputSpec(
            chat=chat,
            stop=body.stop_strings(),
            min_tokens=body.min_tokens,
            logprobs=body.num_logprobs is not None,
            echo_ids=echo,
            echo_text=echoed if echo is not None else "",
        )

    def echo_text(body: CompletionRequest, index: int, prompt_ids: list[int]) -> str:
        """The text an echo repeats: the prompt string as sent, or its ids decoded."""
        prompt = body.prompt
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt[0], str):
            return str(prompt[index])
        return str(service.tokenizer.decode(prompt_ids, skip_special_tokens=False))

    def submit_choices(
        prompts: list[tuple[list[int], OutputSpec]],
        n: int,
        max_tokens: int,
        sampling: SamplingParams,
    ) -> list[Choice]:
        """Submit ``n`` samples of each prompt, choice index ``prompt * n + sample``. A
        seeded sample draws from seed + sample, as vLLM's parallel sampling does. When one
        submission is refused, those already made are aborted and the error propagates."""
        choices: list[Choice] = []
        try:
            for prompt_index, (prompt_ids, spec) in enumerate(prompts):
                for sample in range(n):
                    params = sampling
                    if sampling.seed is not None:
                        params = replace(sampling, seed=sampling.seed + sample)
                    submission = service.submit(prompt_ids, max_tokens, params)
                    output = OutputBuilder(service.tokenizer, spec)
                    index = prompt_index * n + sample
                    choices.append(Choice(index, submission, output, counts_prompt=sample == 0))
        except BaseException:
            for choice in choices:
                service.abort(choice.submission)
            raise
        return choices

    def check_num_choices(num_prompts: int, n: int) -> None:
        if num_prompts * n > MAX_CHOICES:
            raise ApiError(
                400,
                f"{num_prompts} prompts x 'n' = {n} asks for {num_prompts * n} choices; "
                f"at most {MAX_CHOICES} are allowed",
                param="n",
            )

    def meta(prefix: str, request_id: int, chat: bool) -> ResponseMeta:
        created = int(config.unix_clock())
        return ResponseMeta(f"{prefix}-{request_id}", created, config.model_name, chat)

    @router.get("/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "tokenpace",
            "max_model_len": service.limits.max_model_len,
        }
        return {"object": "list", "data": [card]}

    @router.post("/completions", response_model=None)
    async def completions(
        body: CompletionRequest, http: Request
    ) -> JSONResponse | EventSourceResponse:
        check_model(body.model, config.model_name)
        check_num_choices(body.num_prompts, body.n)
        service.check_prompt_chars(longest_prompt_chars(body.prompt), "prompt")
        prompts = completion_prompts(service.tokenizer, body.prompt)
        max_tokens = body.max_tokens or 16
        for ids in prompts:
            service.check_lengths(len(ids), max_tokens, "prompt")
        sampling = sampling_params(body, max_tokens, len(service.tokenizer))
        specs = [
            (
                ids,
                output_spec(
                    body,
                    False,
                    tuple(ids) if body.echo else None,
                    echo_text(body, i, ids) if body.echo else "",
                ),
            )
            for i, ids in enumerate(prompts)
        ]
        choices = submit_choices(specs, body.n, max_tokens, sampling)
        info = meta("cmpl", choices[0].submission.request.request_id, chat=False)
        return await _respond(service, config, choices, body, info, http)

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, http: Request
    ) -> JSONResponse | EventSourceResponse:
        check_model(body.model, config.model_name)
        service.check_prompt_chars(sum(len(m.text()) for m in body.messages), "messages")
        prompt_ids = chat_prompt_ids(service.tokenizer, body.messages)
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = service.check_lengths(len(prompt_ids), requested, "messages")
        sampling = sampling_params(body, max_tokens, len(service.tokenizer))
        spec = output_spec(body, True, None)
        choices = submit_choices([(prompt_ids, spec)], body.n, max_tokens, sampling)
        info = meta("chatcmpl", choices[0].submission.request.request_id, chat=True)
        return await _respond(service, config, choices, body, info, http)

    return router


async def _respond(
    service: Service,
    config: RouteConfig,
    choices: list[Choice],
    body: _SamplingFields,
    info: ResponseMeta,
    http: Request,
) -> JSONResponse | EventSourceResponse:
    if body.stream:
        first: list[Event] = []
        if service.rejects_early:
            try:
                first = await first_events(
                    choices, http, config.disconnect_poll_s, service.abort, service.retry_after_s
                )
            except ClientGone:
                return JSONResponse(error_body(400, "client disconnected", None, None), 499)
        stream = stream_events(
            choices, info, body.include_usage, service.abort, first, body.continuous_usage
        )
        # On shutdown the drain aborts what is still running, so every stream ends with its
        # last chunk and [DONE]; sse-starlette must not cut streams before that. No
        # keep-alive pings: OpenAI's and vLLM's streams carry data events only.
        return EventSourceResponse(
            stream,
            headers={"Cache-Control": "no-cache"},
            ping=0,
            sep="\n",
            shutdown_event=anyio.Event(),
            shutdown_grace_period=config.stream_shutdown_grace_s,
        )
    return await collect_response(
        choices, info, http, config.disconnect_poll_s, service.abort, service.retry_after_s
    )


def attach(app: FastAPI, service: Service, config: RouteConfig) -> None:
    """Mount the /v1 routes and the tokenizer routes on ``app``."""
    app.include_router(build_router(service, config))
    app.include_router(
        build_tokenizer_router(service, config.model_name, config.api_key, config.tokenizer_info)
    )

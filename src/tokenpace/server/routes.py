"""The OpenAI-compatible endpoints: completions and chat completions, streaming or not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from tokenpace.core.sampling import SamplingParams
from tokenpace.server.access import authorizer, check_model
from tokenpace.server.errors import ApiError, error_body
from tokenpace.server.inflight import InFlight
from tokenpace.server.output import OutputBuilder, OutputSpec
from tokenpace.server.prompts import chat_prompt_ids, completion_prompt_ids, prompt_chars
from tokenpace.server.responses import ResponseMeta
from tokenpace.server.schemas import ChatCompletionRequest, CompletionRequest, _SamplingFields
from tokenpace.server.service import Service
from tokenpace.server.streaming import ClientGone, collect_response, first_event, stream_events
from tokenpace.server.tokenizer_routes import build_tokenizer_router


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """HTTP-side settings. ``unix_clock`` stamps ``created`` (Unix seconds);
    ``stream_shutdown_grace_s``: how long open streams may run once shutdown begins (the
    drain ends them before that); ``max_request_bytes``: larger bodies get a 413."""

    model_name: str
    api_key: str | None
    disconnect_poll_s: float
    unix_clock: Callable[[], float]
    stream_shutdown_grace_s: float = 30.0
    max_request_bytes: int = 4 * 2**20


def build_router(service: Service, config: RouteConfig) -> APIRouter:
    """The ``/v1`` routes bound to ``service``."""

    router = APIRouter(prefix="/v1", dependencies=[Depends(authorizer(config.api_key))])

    def sampling_of(body: _SamplingFields, max_tokens: int) -> SamplingParams:
        conflict = body.conflict()
        if conflict is not None:
            raise ApiError(400, conflict[1], param=conflict[0])
        if body.min_tokens > max_tokens:
            raise ApiError(
                400,
                f"'min_tokens' is {body.min_tokens} but 'max_tokens' is {max_tokens}",
                param="min_tokens",
            )
        return SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=body.ignore_eos,
            min_tokens=body.min_tokens,
            logprobs=body.num_logprobs,
            prompt_logprobs=body.num_prompt_logprobs,
        )

    def output_spec(body: _SamplingFields, chat: bool, echo: tuple[int, ...] | None) -> OutputSpec:
        echo_text = ""
        if echo is not None and isinstance(body, CompletionRequest):
            prompt = body.prompt
            if isinstance(prompt, str):
                echo_text = prompt
            elif isinstance(prompt[0], str):
                echo_text = str(prompt[0])
            else:
                echo_text = service.tokenizer.decode(list(echo), skip_special_tokens=False)
        return OutputSpec(
            chat=chat,
            stop=body.stop_strings(),
            min_tokens=body.min_tokens,
            logprobs=body.num_logprobs is not None,
            echo_ids=echo,
            echo_text=echo_text,
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
        service.check_prompt_chars(prompt_chars(body.prompt), "prompt")
        prompt_ids = completion_prompt_ids(service.tokenizer, body.prompt)
        max_tokens = service.check_lengths(len(prompt_ids), body.max_tokens or 16, "prompt")
        sampling = sampling_of(body, max_tokens)
        spec = output_spec(body, False, tuple(prompt_ids) if body.echo else None)
        submission = service.submit(prompt_ids, max_tokens, sampling)
        info = meta("cmpl", submission.request.request_id, chat=False)
        return await _respond(service, config, submission, body, spec, info, http)

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, http: Request
    ) -> JSONResponse | EventSourceResponse:
        check_model(body.model, config.model_name)
        service.check_prompt_chars(sum(len(m.text()) for m in body.messages), "messages")
        prompt_ids = chat_prompt_ids(service.tokenizer, body.messages)
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = service.check_lengths(len(prompt_ids), requested, "messages")
        sampling = sampling_of(body, max_tokens)
        spec = output_spec(body, True, None)
        submission = service.submit(prompt_ids, max_tokens, sampling)
        info = meta("chatcmpl", submission.request.request_id, chat=True)
        return await _respond(service, config, submission, body, spec, info, http)

    return router


async def _respond(
    service: Service,
    config: RouteConfig,
    submission: InFlight,
    body: _SamplingFields,
    spec: OutputSpec,
    info: ResponseMeta,
    http: Request,
) -> JSONResponse | EventSourceResponse:
    output = OutputBuilder(service.tokenizer, spec)
    if body.stream:
        first = None
        if service.rejects_early:
            try:
                first = await first_event(
                    submission, http, config.disconnect_poll_s, service.abort,
                    service.retry_after_s,
                )  # fmt: skip
            except ClientGone:
                return JSONResponse(error_body(400, "client disconnected", None, None), 499)
        stream = stream_events(submission, output, info, body.include_usage, service.abort, first)
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
        submission, output, info, http, config.disconnect_poll_s, service.abort,
        service.retry_after_s,
    )  # fmt: skip


def attach(app: FastAPI, service: Service, config: RouteConfig) -> None:
    """Mount the /v1 routes and the tokenizer routes on ``app``."""
    app.include_router(build_router(service, config))
    app.include_router(build_tokenizer_router(service, config.model_name, config.api_key))

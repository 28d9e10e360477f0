"""The OpenAI-compatible endpoints: completions and chat completions, streaming or not."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse, ServerSentEvent

from tokenpace.core.sampling import SamplingParams
from tokenpace.server.container import InFlight
from tokenpace.server.detokenize import IncrementalText
from tokenpace.server.errors import ApiError, error_body
from tokenpace.server.events import FinishEvent, TokenEvent
from tokenpace.server.responses import (
    ResponseMeta,
    Usage,
    chunk,
    finish_reason_name,
    full_response,
    usage_chunk,
)
from tokenpace.server.schemas import ChatCompletionRequest, CompletionRequest, _SamplingFields
from tokenpace.server.service import Service

DONE = ServerSentEvent(data="[DONE]")


@dataclass(frozen=True, slots=True)
class RouteConfig:
    """HTTP-side settings. ``unix_clock`` stamps ``created`` (Unix seconds);
    ``stream_shutdown_grace_s``: how long open streams may run once shutdown begins (the
    drain ends them before that)."""

    model_name: str
    api_key: str | None
    disconnect_poll_s: float
    unix_clock: Callable[[], float]
    stream_shutdown_grace_s: float = 30.0


def _sse(payload: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps(payload, ensure_ascii=False))


def build_router(service: Service, config: RouteConfig) -> APIRouter:
    """The ``/v1`` routes bound to ``service``."""

    async def authorize(request: Request) -> None:
        if config.api_key is None:
            return
        header = request.headers.get("authorization", "")
        expected = f"Bearer {config.api_key}"
        if not secrets.compare_digest(header.encode(), expected.encode()):
            raise ApiError(401, "missing or invalid API key", code="invalid_api_key")

    router = APIRouter(prefix="/v1", dependencies=[Depends(authorize)])

    def check_model(name: str) -> None:
        if name != config.model_name:
            raise ApiError(
                404,
                f"the model {name!r} does not exist; this server serves {config.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def sampling_of(body: _SamplingFields) -> SamplingParams:
        return SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_strings(),
            ignore_eos=body.ignore_eos,
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
        check_model(body.model)
        prompt_ids = _prompt_ids(service, body.prompt)
        max_tokens = service.check_lengths(len(prompt_ids), body.max_tokens or 16, "prompt")
        submission = service.submit(prompt_ids, max_tokens, sampling_of(body))
        info = meta("cmpl", submission.request.request_id, chat=False)
        return await _respond(service, config, submission, body, info, http)

    @router.post("/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, http: Request
    ) -> JSONResponse | EventSourceResponse:
        check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        text = service.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        prompt_ids = list(service.tokenizer.encode(text, add_special_tokens=False))
        requested = body.max_completion_tokens or body.max_tokens
        max_tokens = service.check_lengths(len(prompt_ids), requested, "messages")
        submission = service.submit(prompt_ids, max_tokens, sampling_of(body))
        info = meta("chatcmpl", submission.request.request_id, chat=True)
        return await _respond(service, config, submission, body, info, http)

    return router


def _prompt_ids(service: Service, prompt: str | list[str] | list[int]) -> list[int]:
    if isinstance(prompt, str):
        return list(service.tokenizer.encode(prompt))
    if prompt and isinstance(prompt[0], str):
        return list(service.tokenizer.encode(prompt[0]))
    ids = [int(t) for t in prompt]
    vocab = len(service.tokenizer)
    if any(not 0 <= t < vocab for t in ids):
        raise ApiError(400, f"'prompt' token ids must be in [0, {vocab})", param="prompt")
    return ids


async def _respond(
    service: Service,
    config: RouteConfig,
    submission: InFlight,
    body: _SamplingFields,
    info: ResponseMeta,
    http: Request,
) -> JSONResponse | EventSourceResponse:
    text = IncrementalText(service.tokenizer, body.stop_strings())
    if body.stream:
        stream = _stream(service, submission, text, info, body.include_usage)
        # On shutdown the drain aborts what is still running, so every stream ends with its
        # last chunk and [DONE]; sse-starlette must not cut streams before that.
        return EventSourceResponse(
            stream,
            headers={"Cache-Control": "no-cache"},
            shutdown_event=anyio.Event(),
            shutdown_grace_period=config.stream_shutdown_grace_s,
        )
    return await _collect(service, config, submission, text, info, http)


async def _stream(
    service: Service,
    submission: InFlight,
    text: IncrementalText,
    info: ResponseMeta,
    include_usage: bool,
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events until ``[DONE]``; aborts the request if the stream is dropped."""
    finished = False
    try:
        if info.chat:
            yield _sse(chunk(info, None, None))
        while True:
            event = await submission.handle.queue.get()
            if isinstance(event, TokenEvent):
                delta = text.push(event.token_id)
                if delta:
                    yield _sse(chunk(info, delta, None))
                continue
            finished = True
            if event.reason is None:
                message = event.error or "the request failed"
                yield _sse(error_body(500, message, None, "engine_error"))
            else:
                reason = finish_reason_name(event.reason, text.stopped)
                yield _sse(chunk(info, text.finish(), reason))
                if include_usage:
                    usage = Usage(event.num_prompt_tokens, event.num_output_tokens)
                    yield _sse(usage_chunk(info, usage))
            yield DONE
            return
    finally:
        if not finished:
            service.abort(submission)


async def _collect(
    service: Service,
    config: RouteConfig,
    submission: InFlight,
    text: IncrementalText,
    info: ResponseMeta,
    http: Request,
) -> JSONResponse:
    """Wait for the whole output, checking every ``disconnect_poll_s`` that the client is
    still there (a gone client aborts the request)."""
    queue = submission.handle.queue
    finished = False
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), config.disconnect_poll_s)
            except TimeoutError:
                if await http.is_disconnected():
                    return JSONResponse(error_body(400, "client disconnected", None, None), 499)
                continue
            if isinstance(event, TokenEvent):
                text.push(event.token_id)
                continue
            finished = True
            return _final(text, info, event)
    finally:
        if not finished:
            service.abort(submission)


def _final(text: IncrementalText, info: ResponseMeta, event: FinishEvent) -> JSONResponse:
    if event.reason is None:
        message = event.error or "the request failed"
        return JSONResponse(error_body(500, message, None, "engine_error"), status_code=500)
    text.finish()
    reason = finish_reason_name(event.reason, text.stopped)
    usage = Usage(event.num_prompt_tokens, event.num_output_tokens)
    return JSONResponse(full_response(info, text.text, reason, usage))


def attach(app: FastAPI, service: Service, config: RouteConfig) -> None:
    app.include_router(build_router(service, config))

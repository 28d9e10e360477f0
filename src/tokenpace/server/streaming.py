"""Delivering one request's events to its client: a server-sent event stream or one body.

Stream events are written as ``data: <json>\\n\\n``, exactly as OpenAI's API and vLLM's
server write them (no ``\\r``, no keep-alive comments), and the stream ends with
``data: [DONE]\\n\\n``; a client that splits the byte stream on blank lines and one that
reads it line by line see the same events. Whatever ends a handler early (a client gone,
a cancelled task) aborts the request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenpace.core.request import FinishReason
from tokenpace.server.errors import ApiError, error_body, error_response
from tokenpace.server.events import Event, FinishEvent, PromptLogprobsEvent, TokenEvent
from tokenpace.server.inflight import InFlight
from tokenpace.server.output import OutputBuilder, Piece
from tokenpace.server.responses import (
    ResponseMeta,
    Usage,
    chunk,
    finish_reason_name,
    full_response,
    usage_chunk,
)

DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as JSON, ended by a blank line."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def rejection_error(event: FinishEvent, retry_after_s: int) -> ApiError:
    """The 429 answering a request the policy refused before serving it."""
    reason = event.error or "the scheduler predicts it would miss its latency objective"
    return ApiError(
        429,
        f"request rejected early: {reason}",
        code="predicted_slo_miss",
        headers={"Retry-After": str(retry_after_s)},
    )


async def first_event(
    submission: InFlight,
    http: Request,
    disconnect_poll_s: float,
    abort: Callable[[InFlight], None],
    retry_after_s: int,
) -> Event:
    """The request's first event, awaited before a stream sends its headers, checking every
    ``disconnect_poll_s`` seconds that the client is still there. Raises ApiError(429) when
    the policy rejected the request (its first and only event) and ``ClientGone`` (after
    aborting the request) when the client left."""
    event = None
    try:
        event = await _next_event(submission, http, disconnect_poll_s)
    finally:
        if event is None:
            abort(submission)
    if event is None:
        raise ClientGone
    if isinstance(event, FinishEvent) and event.reason is FinishReason.REJECT:
        raise rejection_error(event, retry_after_s)
    return event


async def _next_event(submission: InFlight, http: Request, poll_s: float) -> Event | None:
    """The request's next event, checking every ``poll_s`` seconds that the client is
    still there; None when it left."""
    while True:
        try:
            return await asyncio.wait_for(submission.handle.queue.get(), poll_s)
        except TimeoutError:
            if await http.is_disconnected():
                return None


class ClientGone(Exception):
    """The client disconnected before its request produced anything."""


async def stream_events(
    submission: InFlight,
    output: OutputBuilder,
    meta: ResponseMeta,
    include_usage: bool,
    abort: Callable[[InFlight], None],
    first: Event | None = None,
) -> AsyncIterator[bytes]:
    """Server-sent events until ``[DONE]``. With ``include_usage`` every chunk carries
    ``"usage": null`` and a last chunk with empty ``choices`` carries the usage, as OpenAI
    sends them. ``first``: the request's first event when the caller already took it from
    the queue (``first_event``)."""
    finished = False
    usage_field = include_usage
    pending = [first] if first is not None else []

    def piece_chunk(piece: Piece, reason: str | None) -> bytes:
        body = chunk(meta, piece.text, reason, piece.logprobs, usage_field)
        return sse_event(body)

    try:
        if meta.chat:
            yield sse_event(chunk(meta, None, None, None, usage_field))
        echoed = False
        while True:
            event = pending.pop() if pending else await submission.handle.queue.get()
            if isinstance(event, PromptLogprobsEvent):
                output.prompt_logprobs(event)
                continue
            if not echoed:
                echoed = True
                echo = output.echo()
                if echo is not None:
                    yield piece_chunk(echo, None)
            if isinstance(event, TokenEvent):
                piece = output.push(event)
                if piece is not None:
                    yield piece_chunk(piece, None)
                continue
            finished = True
            if event.reason is None:
                message = event.error or "the request failed"
                yield sse_event(error_body(500, message, None, "engine_error"))
            else:
                reason = finish_reason_name(event.reason, output.text.stopped)
                yield piece_chunk(output.finish(), reason)
                if include_usage:
                    usage = Usage(event.num_prompt_tokens, event.num_output_tokens)
                    yield sse_event(usage_chunk(meta, usage))
            yield DONE
            return
    finally:
        if not finished:
            abort(submission)


async def collect_response(
    submission: InFlight,
    output: OutputBuilder,
    meta: ResponseMeta,
    http: Request,
    disconnect_poll_s: float,
    abort: Callable[[InFlight], None],
    retry_after_s: int = 1,
) -> JSONResponse:
    """Wait for the whole output, checking every ``disconnect_poll_s`` seconds that the
    client is still there (a gone client aborts the request). A request the policy rejected
    is answered 429 with ``Retry-After: retry_after_s``."""
    finished = False
    try:
        while True:
            event = await _next_event(submission, http, disconnect_poll_s)
            if event is None:
                return JSONResponse(error_body(400, "client disconnected", None, None), 499)
            if isinstance(event, PromptLogprobsEvent):
                output.prompt_logprobs(event)
            elif isinstance(event, TokenEvent):
                output.push(event)
            else:
                finished = True
                if event.reason is FinishReason.REJECT:
                    return error_response(rejection_error(event, retry_after_s))
                return _final(output, meta, event)
    finally:
        if not finished:
            abort(submission)


def _final(output: OutputBuilder, meta: ResponseMeta, event: FinishEvent) -> JSONResponse:
    if event.reason is None:
        message = event.error or "the request failed"
        return JSONResponse(error_body(500, message, None, "engine_error"), status_code=500)
    whole = output.whole()
    reason = finish_reason_name(event.reason, output.text.stopped)
    usage = Usage(event.num_prompt_tokens, event.num_output_tokens)
    return JSONResponse(full_response(meta, whole.text, reason, usage, whole.logprobs))

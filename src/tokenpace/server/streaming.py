"""Delivering a response's events to its client: a server-sent event stream or one body.

Stream events are written as ``data: <json>\\n\\n``, exactly as OpenAI's API and vLLM's
server write them (no ``\\r``, no keep-alive comments), and the stream ends with
``data: [DONE]\\n\\n``; a client that splits the byte stream on blank lines and one that
reads it line by line see the same events. Whatever ends a handler early (a client gone,
a cancelled task) aborts the request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenpace.core.request import FinishReason
from tokenpace.server.choices import Choice, ChoiceEvents
from tokenpace.server.errors import ApiError, error_body, error_response
from tokenpace.server.events import Event, FinishEvent, PromptLogprobsEvent, TokenEvent
from tokenpace.server.inflight import InFlight
from tokenpace.server.output import Piece
from tokenpace.server.responses import (
    ChoiceResult,
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


async def first_events(
    choices: Sequence[Choice],
    http: Request,
    disconnect_poll_s: float,
    abort: Callable[[InFlight], None],
    retry_after_s: int,
) -> list[Event]:
    """Every choice's first event (``first_event``), in choice order. When one is rejected
    or the client leaves, the choices not yet rejected are aborted before the error
    propagates, so none keeps running for nobody."""
    firsts: list[Event] = []
    try:
        for choice in choices:
            firsts.append(
                await first_event(choice.submission, http, disconnect_poll_s, abort, retry_after_s)
            )
    except BaseException:
        for choice in choices[: len(firsts)]:
            abort(choice.submission)
        for choice in choices[len(firsts) + 1 :]:
            abort(choice.submission)
        raise
    return firsts


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


def _prompt_tokens(choice: Choice, event: FinishEvent) -> int:
    return event.num_prompt_tokens if choice.counts_prompt else 0


async def stream_events(
    choices: Sequence[Choice],
    meta: ResponseMeta,
    include_usage: bool,
    abort: Callable[[InFlight], None],
    first: Sequence[Event] = (),
    continuous_usage: bool = False,
) -> AsyncIterator[bytes]:
    """Server-sent events of every choice, each chunk tagged with its choice's index, until
    ``[DONE]`` after the last choice has finished. With ``include_usage`` every chunk
    carries ``"usage": null`` and a last chunk with empty ``choices`` carries the usage
    summed over the choices, as OpenAI sends them. ``first``: the choices' first events
    when the caller already took them from their queues (``first_events``). With
    ``continuous_usage`` every chunk's ``usage`` is its choice's so far instead of null
    (vLLM's ``continuous_usage_stats``). A failed choice ends the stream with an error
    event, and the others are aborted."""
    events = ChoiceEvents(choices, first)
    usage = Usage(0, 0)
    echoed: set[int] = set()
    num_tokens = dict.fromkeys((c.index for c in choices), 0)

    def so_far(choice: Choice, completion_tokens: int | None = None) -> Usage | None:
        if not continuous_usage:
            return None
        done = num_tokens[choice.index] if completion_tokens is None else completion_tokens
        return Usage(choice.submission.request.num_prompt_tokens, done)

    def piece_chunk(
        choice: Choice, piece: Piece, reason: str | None, done: int | None = None
    ) -> bytes:
        body = chunk(
            meta, piece.text, reason, piece.logprobs, include_usage, choice.index,
            so_far(choice, done),
        )  # fmt: skip
        return sse_event(body)

    try:
        if meta.chat:
            for choice in choices:
                role = chunk(meta, None, None, None, include_usage, choice.index, so_far(choice))
                yield sse_event(role)
        while events.open:
            got = await events.next()
            assert got is not None  # no timeout
            choice, event = got
            output = choice.output
            if isinstance(event, PromptLogprobsEvent):
                output.prompt_logprobs(event)
                continue
            if choice.index not in echoed:
                echoed.add(choice.index)
                echo = output.echo()
                if echo is not None:
                    yield piece_chunk(choice, echo, None)
            if isinstance(event, TokenEvent):
                num_tokens[choice.index] += 1
                piece = output.push(event)
                if piece is not None:
                    yield piece_chunk(choice, piece, None)
                continue
            if event.reason is None:
                message = event.error or "the request failed"
                yield sse_event(error_body(500, message, None, "engine_error"))
                yield DONE
                return
            reason = finish_reason_name(event.reason, output.text.stopped)
            yield piece_chunk(choice, output.finish(), reason, event.num_output_tokens)
            usage = Usage(
                usage.prompt_tokens + _prompt_tokens(choice, event),
                usage.completion_tokens + event.num_output_tokens,
            )
        if include_usage:
            yield sse_event(usage_chunk(meta, usage))
        yield DONE
    finally:
        events.close()
        for choice in events.unfinished():
            abort(choice.submission)


async def collect_response(
    choices: Sequence[Choice],
    meta: ResponseMeta,
    http: Request,
    disconnect_poll_s: float,
    abort: Callable[[InFlight], None],
    retry_after_s: int = 1,
) -> JSONResponse:
    """Wait for every choice's whole output, checking every ``disconnect_poll_s`` seconds
    that the client is still there (a gone client aborts them all). A choice the policy
    rejected answers the request 429 with ``Retry-After: retry_after_s``, a failed one 500;
    the other choices are then aborted."""
    events = ChoiceEvents(choices)
    results: list[ChoiceResult] = []
    usage = Usage(0, 0)
    try:
        while events.open:
            got = await events.next(disconnect_poll_s)
            if got is None:
                if await http.is_disconnected():
                    return JSONResponse(error_body(400, "client disconnected", None, None), 499)
                continue
            choice, event = got
            output = choice.output
            if isinstance(event, PromptLogprobsEvent):
                output.prompt_logprobs(event)
            elif isinstance(event, TokenEvent):
                output.push(event)
            elif event.reason is FinishReason.REJECT:
                return error_response(rejection_error(event, retry_after_s))
            elif event.reason is None:
                message = event.error or "the request failed"
                return JSONResponse(error_body(500, message, None, "engine_error"), 500)
            else:
                whole = output.whole()
                reason = finish_reason_name(event.reason, output.text.stopped)
                results.append(ChoiceResult(choice.index, whole.text, reason, whole.logprobs))
                usage = Usage(
                    usage.prompt_tokens + _prompt_tokens(choice, event),
                    usage.completion_tokens + event.num_output_tokens,
                )
        return JSONResponse(full_response(meta, results, usage))
    finally:
        events.close()
        for choice in events.unfinished():
            abort(choice.submission)

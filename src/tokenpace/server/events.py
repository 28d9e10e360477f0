"""What flows from an engine thread to a waiting HTTP handler, and the handle it flows to."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenpace.core.logprobs import TokenLogprob
from tokenpace.core.request import FinishReason


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One output token, delivered at ``time_s`` (seconds on the server clock), with its
    logprobs when the request asked for them."""

    token_id: int
    time_s: float
    logprob: TokenLogprob | None = None


@dataclass(frozen=True, slots=True)
class PromptLogprobsEvent:
    """The logprobs of prompt positions 1.. (the first prompt token has none); comes
    before the first ``TokenEvent`` of a request that asked for prompt logprobs."""

    entries: tuple[TokenLogprob, ...]


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The request left the engine. ``reason`` is None when it failed; ``error`` then says
    why in one sentence. Token counts are what the engine computed for it."""

    reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    error: str | None = None


Event = TokenEvent | PromptLogprobsEvent | FinishEvent


@dataclass(slots=True, eq=False)
class RequestHandle:
    """The HTTP side of one request: events arrive on ``queue`` in the handler's event
    loop. Engine threads never touch the queue directly; they go through ``post_events``."""

    request_id: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)


def _put_all(batch: Sequence[tuple[RequestHandle, Event]]) -> None:
    for handle, event in batch:
        handle.queue.put_nowait(event)


def post_events(batch: Sequence[tuple[RequestHandle, Event]]) -> None:
    """Deliver ``batch`` from any thread: one ``call_soon_threadsafe`` per event loop, so a
    step with many tokens wakes each loop once. Events of a closed loop are dropped."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, Event]]] = {}
    for handle, event in batch:
        by_loop.setdefault(handle.loop, []).append((handle, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:
            continue

"""``first_event``: what a stream awaits before its headers when the policy may reject."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tokenpace.core.request import FinishReason, Request
from tokenpace.server.errors import ApiError
from tokenpace.server.events import FinishEvent, RequestHandle, TokenEvent
from tokenpace.server.inflight import InFlight
from tokenpace.server.streaming import ClientGone, first_event


class Client:
    """The one thing ``first_event`` asks of the HTTP request: is its client gone."""

    def __init__(self, gone: bool) -> None:
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def run(
    events: list[Any], gone: bool = False, aborted: list[InFlight] | None = None
) -> tuple[Any, list[InFlight]]:
    aborted = [] if aborted is None else aborted

    async def main() -> Any:
        inflight = InFlight(Request(7, 4, 8, 0.0), RequestHandle(7, asyncio.get_running_loop()))
        for event in events:
            inflight.handle.queue.put_nowait(event)
        return await first_event(inflight, Client(gone), 0.01, aborted.append, 3)  # type: ignore[arg-type]

    return asyncio.run(main()), aborted


def test_an_accepted_request_streams_from_its_first_event() -> None:
    token = TokenEvent(5, 1.0)
    got, aborted = run([token, FinishEvent(FinishReason.LENGTH, 4, 1)])
    assert got is token and not aborted


def test_a_rejected_request_is_a_429_with_the_policys_reason() -> None:
    reason = "the scheduler predicts a time to first token of 3.00 s"
    with pytest.raises(ApiError) as raised:
        run([FinishEvent(FinishReason.REJECT, 4, 0, reason)])
    assert raised.value.status == 429 and reason in raised.value.message
    assert raised.value.headers == {"Retry-After": "3"}


def test_a_client_gone_before_any_event_aborts_the_request() -> None:
    aborted: list[InFlight] = []
    with pytest.raises(ClientGone):
        run([], gone=True, aborted=aborted)
    assert [a.request.request_id for a in aborted] == [7]

"""``ChoiceEvents``: the events of a response's choices, read together as they arrive."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from tokenpace.core.request import FinishReason, Request
from tokenpace.server.choices import Choice, ChoiceEvents
from tokenpace.server.events import FinishEvent, RequestHandle, TokenEvent
from tokenpace.server.inflight import InFlight
from tokenpace.server.output import OutputBuilder


def choices(count: int) -> list[Choice]:
    loop = asyncio.get_running_loop()
    made = []
    for index in range(count):
        inflight = InFlight(Request(index, 4, 8, 0.0), RequestHandle(index, loop))
        # ChoiceEvents never reads the output builder.
        made.append(Choice(index, inflight, cast(OutputBuilder, None)))
    return made


def put(choice: Choice, *events: Any) -> None:
    for event in events:
        choice.submission.handle.queue.put_nowait(event)


def finish(tokens: int) -> FinishEvent:
    return FinishEvent(FinishReason.LENGTH, 4, tokens)


def test_events_of_several_choices_come_in_arrival_order_until_each_finishes() -> None:
    async def main() -> list[tuple[int, Any]]:
        a, b = choices(2)
        events = ChoiceEvents([a, b])
        got = []
        put(b, TokenEvent(20, 0.1))
        got.append(await events.next())
        put(a, TokenEvent(10, 0.2), TokenEvent(11, 0.3))
        got.append(await events.next())
        got.append(await events.next())
        put(a, finish(2))
        got.append(await events.next())
        put(b, TokenEvent(21, 0.4), finish(2), TokenEvent(99, 0.5))  # after its finish: unread
        while events.open:
            got.append(await events.next())
        with pytest.raises(RuntimeError):
            await events.next()
        assert b.submission.handle.queue.qsize() == 1
        return [(c.index, e) for c, e in cast(list[tuple[Choice, Any]], got)]

    got = asyncio.run(main())
    assert [(i, getattr(e, "token_id", "end")) for i, e in got] == [
        (1, 20), (0, 10), (0, 11), (0, "end"), (1, 21), (1, "end"),
    ]  # fmt: skip


def test_a_timeout_returns_none_and_loses_no_event() -> None:
    async def main() -> list[Any]:
        (a,) = choices(1)
        events = ChoiceEvents([a])
        assert await events.next(0.01) is None
        put(a, TokenEvent(5, 0.1), finish(1))
        got = [await events.next(0.01), await events.next(0.01)]
        assert not events.open and not events.unfinished()
        return [e for _, e in cast(list[tuple[Choice, Any]], got)]

    first, last = asyncio.run(main())
    assert first.token_id == 5 and isinstance(last, FinishEvent)


def test_first_events_already_taken_come_first_and_a_finished_choice_is_not_read() -> None:
    async def main() -> tuple[list[int], int]:
        a, b = choices(2)
        events = ChoiceEvents([a, b], [finish(0), TokenEvent(7, 0.0)])
        put(a, TokenEvent(1, 0.1))  # a finished already: never read
        put(b, finish(1))
        order = []
        while events.open:
            got = await events.next()
            assert got is not None
            order.append(got[0].index)
        events.close()
        return order, a.submission.handle.queue.qsize()

    order, left = asyncio.run(main())
    assert order == [0, 1, 1] and left == 1


def test_close_cancels_pending_reads() -> None:
    async def main() -> list[Choice]:
        a, b = choices(2)
        events = ChoiceEvents([a, b])
        put(a, finish(0))
        await events.next()
        assert [c.index for c in events.unfinished()] == [1]
        events.close()
        await asyncio.sleep(0)
        put(b, TokenEvent(3, 0.0))  # nobody reads it now
        await asyncio.sleep(0)
        assert b.submission.handle.queue.qsize() == 1
        return events.unfinished()

    assert [c.index for c in asyncio.run(main())] == [1]


def test_one_stream_is_read_from_its_queue_and_a_pending_read_is_not_lost() -> None:
    async def main() -> list[Any]:
        (a,) = choices(1)
        events = ChoiceEvents([a])
        assert await events.next(0.01) is None  # leaves a read pending on the queue
        put(a, TokenEvent(1, 0.1), TokenEvent(2, 0.2), finish(2))
        got = []
        while events.open:
            pair = await events.next()  # no timeout: straight from the queue once free
            assert pair is not None
            got.append(pair[1])
        return got

    got = asyncio.run(main())
    assert [getattr(e, "token_id", "end") for e in got] == [1, 2, "end"]

"""The choices of one response (several prompts, ``n`` samples each) and their events.

Each choice is an engine request of its own; ``ChoiceEvents`` reads their event queues
together and hands out each event as it arrives, tagged with its choice, until every
choice has finished.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.server.events import Event, FinishEvent
from tokenpace.server.inflight import InFlight
from tokenpace.server.output import OutputBuilder


@dataclass(frozen=True, slots=True)
class Choice:
    """One sequence of a response: its ``index`` in ``choices``, the engine request behind
    it and the builder of what the client sees. ``counts_prompt``: its prompt's tokens
    count in the usage (once per prompt, however many samples share it)."""

    index: int
    submission: InFlight
    output: OutputBuilder
    counts_prompt: bool = True


class ChoiceEvents:
    """Events of ``choices`` in arrival order, as (choice, event) pairs; a choice is read
    until its ``FinishEvent``. ``first``: events already taken from the queues (at most
    one per choice, in order), handed out before any other."""

    def __init__(self, choices: Sequence[Choice], first: Sequence[Event] = ()) -> None:
        if len(first) > len(choices):
            raise ValueError("more first events than choices")
        self._choices = list(choices)
        self._by_index = {c.index: c for c in self._choices}
        self._ready: deque[tuple[Choice, Event]] = deque(zip(self._choices, first, strict=False))
        self._gets: dict[int, asyncio.Task[Event]] = {}
        self._finished: set[int] = set()
        self._handed_finish: set[int] = set()
        for choice, event in self._ready:
            if isinstance(event, FinishEvent):
                self._finished.add(choice.index)

    @property
    def open(self) -> bool:
        """Whether some choice has events still to hand out."""
        return len(self._handed_finish) < len(self._choices)

    def unfinished(self) -> list[Choice]:
        """The choices whose finish has not been handed out."""
        return [c for c in self._choices if c.index not in self._handed_finish]

    async def next(self, timeout_s: float | None = None) -> tuple[Choice, Event] | None:
        """The next event; None when ``timeout_s`` passed first (the reads stay pending for
        the next call). Raises RuntimeError once every choice has finished."""
        if not self._ready:
            if not self.open:
                raise RuntimeError("every choice has finished")
            reading = [c for c in self._choices if c.index not in self._finished]
            if timeout_s is None and len(reading) == 1 and not self._gets:
                # One stream left and no read pending: wait on its queue directly, without
                # a task per event (a stream's common case: one choice).
                (choice,) = reading
                event = await choice.submission.handle.queue.get()
                if isinstance(event, FinishEvent):
                    self._finished.add(choice.index)
                    self._handed_finish.add(choice.index)
                return choice, event
            for choice in self._choices:
                index = choice.index
                if index not in self._finished and index not in self._gets:
                    queue = choice.submission.handle.queue
                    self._gets[index] = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                self._gets.values(), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                return None
            for index, task in list(self._gets.items()):
                if task.done():
                    del self._gets[index]
                    event = task.result()
                    if isinstance(event, FinishEvent):
                        self._finished.add(index)
                    self._ready.append((self._by_index[index], event))
        choice, event = self._ready.popleft()
        if isinstance(event, FinishEvent):
            self._handed_finish.add(choice.index)
        return choice, event

    def close(self) -> None:
        """Stop reading: cancel the pending reads (their events are not wanted)."""
        for task in self._gets.values():
            task.cancel()
        self._gets.clear()

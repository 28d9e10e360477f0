"""Output token ids to text deltas, with stop strings cut out.

The streamed deltas always concatenate to the final text: a delta is only emitted once no
later token can change it, i.e. text that could still be the start of a stop string and a
trailing incomplete UTF-8 character are held back until the next token decides.
"""

from __future__ import annotations

from typing import Any

_REPLACEMENT = "\ufffd"


class IncrementalText:
    """Accumulates output tokens of one request. ``push`` returns the new text that is
    safe to send; ``finish`` returns the rest. Once a stop string appears, the text ends
    just before it and later tokens add nothing. With ``min_tokens``, as in the engines, a
    stop string counts only once that many tokens exist and only if it ends in the text
    of token ``min_tokens`` or later."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], min_tokens: int = 0) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._min_tokens = min_tokens
        self._ids: list[int] = []
        self._text = ""
        self._emitted = 0
        # Text length of the first min_tokens - 1 tokens: a stop string must end past it.
        self._floor = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """The whole output text so far (stop string excluded)."""
        return self._text

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token_id)
        self._text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        if len(self._ids) < self._min_tokens:
            self._floor = len(self._text)
            return self._take(self._safe_end())
        cut = self._first_stop()
        if cut is not None:
            self._text = self._text[:cut]
            self.stopped = True
            return self._take(len(self._text))
        return self._take(self._safe_end())

    def finish(self) -> str:
        return self._take(len(self._text))

    def _take(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        delta = self._text[self._emitted : end]
        self._emitted = end
        return delta

    def _first_stop(self) -> int | None:
        """Where the earliest stop string starts in the text not yet sent, if any."""
        found = [
            i
            for i in (
                self._text.find(s, max(self._emitted, self._floor - len(s) + 1)) for s in self._stop
            )
            if i >= 0
        ]
        return min(found) if found else None

    def _safe_end(self) -> int:
        text = self._text
        end = len(text)
        while end > self._emitted and text[end - 1] == _REPLACEMENT:
            end -= 1
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, end), held, -1):
                if text[end - size : end] == stop[:size]:
                    held = size
                    break
        return end - held

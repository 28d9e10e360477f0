"""Output token ids to text deltas, with stop strings cut out.

The streamed deltas always concatenate to the final text: a delta is only emitted once no
later token can change it, i.e. text that could still be the start of a stop string and a
trailing incomplete UTF-8 character are held back until the next token decides. Each token
costs time independent of the output length: ids are decoded incrementally
(``text_stream``) and stop strings are searched only in the text not yet sent.
"""

from __future__ import annotations

from typing import Any

from tokenpace.server.text_stream import text_stream


class IncrementalText:
    """Accumulates output tokens of one request. ``push`` returns the new text that is
    safe to send; ``finish`` returns the rest. Once a stop string appears, the text ends
    just before it and later tokens add nothing. With ``min_tokens``, as in the engines, a
    stop string counts only once that many tokens exist and only if it ends in the text
    of token ``min_tokens`` or later."""

    def __init__(self, tokenizer: Any, stop: tuple[str, ...], min_tokens: int = 0) -> None:
        self._stream = text_stream(tokenizer)
        self._stop = stop
        self._min_tokens = min_tokens
        self._num_tokens = 0
        self._sent: list[str] = []
        self._num_sent_chars = 0
        # Decoded text not yet sent: at most a stop string's length plus the last delta.
        self._held = ""
        # Text length of the first min_tokens - 1 tokens: a stop string must end past it.
        self._floor = 0
        self.stopped = False

    @property
    def text(self) -> str:
        """The whole output text so far (stop string excluded)."""
        return "".join(self._sent) + self._held

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._num_tokens += 1
        self._held += self._stream.step(token_id) or ""
        if self._num_tokens < self._min_tokens:
            self._floor = self._num_sent_chars + len(self._held)
            return self._send(self._safe_end())
        cut = self._first_stop()
        if cut is not None:
            self._held = self._held[:cut]
            self.stopped = True
            return self._send(len(self._held))
        return self._send(self._safe_end())

    def finish(self) -> str:
        if not self.stopped:
            self._held += self._stream.flush()
        return self._send(len(self._held))

    def _send(self, end: int) -> str:
        """Sends the first ``end`` characters of the held text."""
        if end <= 0:
            return ""
        delta, self._held = self._held[:end], self._held[end:]
        self._sent.append(delta)
        self._num_sent_chars += len(delta)
        return delta

    def _first_stop(self) -> int | None:
        """Where the earliest stop string starts in the held text, if any."""
        floor = self._floor - self._num_sent_chars
        found = [
            i
            for i in (self._held.find(s, max(0, floor - len(s) + 1)) for s in self._stop)
            if i >= 0
        ]
        return min(found) if found else None

    def _safe_end(self) -> int:
        """How much of the held text no later token can change: all but its longest end
        that could begin a stop string."""
        text = self._held
        end = len(text)
        held = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, end), held, -1):
                if text[end - size :] == stop[:size]:
                    held = size
                    break
        return end - held

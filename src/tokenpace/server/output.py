"""One request's output as the client sees it: text deltas, and logprobs aligned to them.

Text comes from ``IncrementalText`` (stop strings cut, incomplete characters held back).
Logprob items of the tokens behind held-back text wait for the next chunk that carries
text, so each streamed chunk's logprobs cover the tokens that produced its text. An echoed
prompt (completions) comes first, with its logprobs when they were asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenpace.server.detokenize import IncrementalText
from tokenpace.server.events import PromptLogprobsEvent, TokenEvent
from tokenpace.server.logprob_format import LogprobFormatter, LogprobItem


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What the client asked to see. ``echo_ids``/``echo_text``: the prompt to repeat
    before the output (None: no echo); ``logprobs``: whether tokens carry logprobs."""

    chat: bool
    stop: tuple[str, ...]
    min_tokens: int
    logprobs: bool
    echo_ids: tuple[int, ...] | None = None
    echo_text: str = ""


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of output: ``text`` and, when logprobs were asked for, their body."""

    text: str
    logprobs: dict[str, Any] | None


class OutputBuilder:
    """Feed it a request's events; it returns the pieces to send."""

    def __init__(self, tokenizer: Any, spec: OutputSpec) -> None:
        self._spec = spec
        self.text = IncrementalText(tokenizer, spec.stop, spec.min_tokens)
        offset = len(spec.echo_text) if spec.echo_ids is not None else 0
        self._format = LogprobFormatter(tokenizer, spec.chat, offset)
        self._echo_format = LogprobFormatter(tokenizer, spec.chat, 0)
        self._pending: list[LogprobItem] = []
        self._prompt_entries: PromptLogprobsEvent | None = None
        self._output_items: list[LogprobItem] = []

    def prompt_logprobs(self, event: PromptLogprobsEvent) -> None:
        self._prompt_entries = event

    def echo(self) -> Piece | None:
        """The echoed prompt (None without echo). Call once, before any token."""
        if self._spec.echo_ids is None:
            return None
        if not self._spec.logprobs:
            return Piece(self._spec.echo_text, None)
        return Piece(self._spec.echo_text, self._echo_format.format(self._prompt_items()))

    def push(self, event: TokenEvent) -> Piece | None:
        """The piece this token makes sendable (None while its text is held back)."""
        delta = self.text.push(event.token_id)
        if self._spec.logprobs and event.logprob is not None:
            item = LogprobItem(event.token_id, event.logprob)
            self._pending.append(item)
            self._output_items.append(item)
        return self._piece(delta) if delta else None

    def finish(self) -> Piece:
        """Everything not yet sent (possibly empty text)."""
        return self._piece(self.text.finish())

    def whole(self) -> Piece:
        """The whole output at once (non-streaming), echo included."""
        self.text.finish()
        echo = self._spec.echo_text if self._spec.echo_ids is not None else ""
        if not self._spec.logprobs:
            return Piece(echo + self.text.text, None)
        items = [*self._prompt_items(), *self._output_items]
        return Piece(echo + self.text.text, self._echo_format.format(items))

    def _prompt_items(self) -> list[LogprobItem]:
        ids = self._spec.echo_ids
        if not ids:
            return []
        entries = self._prompt_entries.entries if self._prompt_entries is not None else ()
        return [LogprobItem(ids[0], None), *(LogprobItem(e.token_id, e) for e in entries)]

    def _piece(self, text: str) -> Piece:
        if not self._spec.logprobs:
            return Piece(text, None)
        items, self._pending = self._pending, []
        return Piece(text, self._format.format(items))

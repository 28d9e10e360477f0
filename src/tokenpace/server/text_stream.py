"""Token ids to text, one token at a time, in time linear in the output length.

A stream returns the text a new token completes, or None while the text so far ends in an
incomplete character (or the token adds no text, as a skipped special token). The pieces
concatenate to what decoding all ids at once gives; ``flush`` returns the rest at the end,
incomplete characters included (as U+FFFD, like a full decode).

A tokenizer backed by the ``tokenizers`` library (every Hugging Face fast tokenizer) is
streamed by that library's ``DecodeStream``; any other tokenizer with ``decode(ids,
skip_special_tokens=...)`` by decoding a short window of ids around the new one: the text
of the window minus the text of its already-sent head (the prefix-offset method), so each
token costs a few tokens' decoding whatever the output length.
"""

from __future__ import annotations

from typing import Any, Protocol

_REPLACEMENT = "\ufffd"


class TextStream(Protocol):
    """Incremental decoding of one request's output ids (special tokens skipped)."""

    def step(self, token_id: int) -> str | None:
        """The text ``token_id`` completes, or None when none can be sent yet."""
        ...

    def flush(self) -> str:
        """The text of the ids not yet sent (empty when none): call once, at the end."""
        ...


class WindowTextStream:
    """The prefix-offset method over any ``tokenizer.decode``. Ids before ``_prefix`` are
    sent and no longer decoded; ids from ``_prefix`` to ``_read`` were sent and are decoded
    again only as context, so that decoders that treat the first token apart (a leading
    space stripped) give the same text as a full decode."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""

    def step(self, token_id: int) -> str | None:
        self._ids.append(token_id)
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(self._prefix_text) or text.endswith(_REPLACEMENT):
            return None
        delta = text[len(self._prefix_text) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix : self._read])
        return delta

    def flush(self) -> str:
        if self._read == len(self._ids):
            return ""
        text = self._decode(self._ids[self._prefix :])
        self._read = len(self._ids)
        return text[len(self._prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        text: str = self._tokenizer.decode(ids, skip_special_tokens=True)
        return text


class FastTextStream:
    """The ``tokenizers`` library's ``DecodeStream`` on a fast tokenizer's backend. The
    library keeps no way to read what it holds back, so ``flush`` decodes the whole output
    once when ids are left unsent (a stream that ended inside a character or on a skipped
    special token)."""

    def __init__(self, backend: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)
        self._ids: list[int] = []
        self._num_sent_ids = 0
        self._num_sent_chars = 0

    def step(self, token_id: int) -> str | None:
        self._ids.append(token_id)
        delta: str | None = self._stream.step(self._backend, token_id)
        if delta is not None:
            self._num_sent_ids = len(self._ids)
            self._num_sent_chars += len(delta)
        return delta

    def flush(self) -> str:
        if self._num_sent_ids == len(self._ids):
            return ""
        text: str = self._backend.decode(self._ids, skip_special_tokens=True)
        self._num_sent_ids = len(self._ids)
        rest = text[self._num_sent_chars :]
        self._num_sent_chars = len(text)
        return rest


def text_stream(tokenizer: Any) -> TextStream:
    """The stream for ``tokenizer``: ``FastTextStream`` when it is a fast tokenizer whose
    ``decode`` is its backend's (no clean-up of spaces afterwards), else
    ``WindowTextStream``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        from tokenizers import Tokenizer

        if isinstance(backend, Tokenizer):
            return FastTextStream(backend)
    return WindowTextStream(tokenizer)

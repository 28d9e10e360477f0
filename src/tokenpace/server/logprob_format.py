"""Token logprobs in OpenAI's two shapes: completions' parallel lists and chat's entries.

Completions (``logprobs`` = k): ``{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}``, one element per token; ``top_logprobs[i]`` maps token text to logprob
for the k most likely tokens plus the chosen one (as vLLM reports it); an echoed prompt's
first token has ``None`` for both. Chat (``logprobs: true``, ``top_logprobs`` = k):
``{"content": [{"token", "logprob", "bytes", "top_logprobs": [k entries]}]}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpace.core.logprobs import TokenLogprob


@dataclass(frozen=True, slots=True)
class LogprobItem:
    """One token to report: its id and logprobs (None: the first prompt token)."""

    token_id: int
    logprob: TokenLogprob | None


class LogprobFormatter:
    """Turns ``LogprobItem`` runs into OpenAI bodies. Completions' ``text_offset`` counts
    characters from ``initial_offset`` and carries on across calls, so streamed chunks
    continue where the last one ended."""

    def __init__(self, tokenizer: Any, chat: bool, initial_offset: int = 0) -> None:
        self._tokenizer = tokenizer
        self._chat = chat
        self._offset = initial_offset

    def token_text(self, token_id: int) -> str:
        text: str = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def format(self, items: Sequence[LogprobItem]) -> dict[str, Any]:
        return self._chat_body(items) if self._chat else self._completion_body(items)

    def _completion_body(self, items: Sequence[LogprobItem]) -> dict[str, Any]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for item in items:
            text = self.token_text(item.token_id)
            tokens.append(text)
            offsets.append(self._offset)
            self._offset += len(text)
            entry = item.logprob
            if entry is None:
                token_logprobs.append(None)
                tops.append(None)
                continue
            token_logprobs.append(entry.logprob)
            top = {self.token_text(token): value for token, value in entry.top}
            top.setdefault(text, entry.logprob)
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _chat_body(self, items: Sequence[LogprobItem]) -> dict[str, Any]:
        content = []
        for item in items:
            entry = item.logprob
            assert entry is not None, "chat reports output tokens only"
            content.append(
                {
                    **self._chat_entry(item.token_id, entry.logprob),
                    "top_logprobs": [self._chat_entry(t, v) for t, v in entry.top],
                }
            )
        return {"content": content}

    def _chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

"""Bodies of OpenAI-style responses and stream chunks (plain JSON-ready dicts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenpace.core.request import FinishReason


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request."""

    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """What every chunk of one response repeats. ``created`` is Unix seconds."""

    response_id: str
    created: int
    model: str
    chat: bool

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"


def finish_reason_name(reason: FinishReason, stopped_by_text: bool) -> str:
    """OpenAI's finish_reason: "stop", "length", or "abort" (the server ended it)."""
    if stopped_by_text or reason is FinishReason.STOP:
        return "stop"
    if reason is FinishReason.LENGTH:
        return "length"
    return "abort"


@dataclass(frozen=True, slots=True)
class ChoiceResult:
    """One finished choice of a non-streaming response."""

    index: int
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None = None


def chunk(
    meta: ResponseMeta,
    text: str | None,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None = None,
    with_usage: bool = False,
    index: int = 0,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """One stream chunk of choice ``index`` carrying ``text`` (chat: a content delta; None:
    the role delta) and the ``logprobs`` of its tokens; ``with_usage`` adds ``"usage"``:
    null, or ``usage`` when given (vLLM's continuous usage stats)."""
    choice: dict[str, Any]
    if meta.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if text is None else {}
        if text:
            delta["content"] = text
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    else:
        choice = {
            "index": index,
            "text": text or "",
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
    body: dict[str, Any] = {
        "id": meta.response_id,
        "object": meta.chunk_object,
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    }
    if with_usage:
        body["usage"] = None if usage is None else usage.to_dict()
    return body


def usage_chunk(meta: ResponseMeta, usage: Usage) -> dict[str, Any]:
    """The final chunk sent when ``stream_options.include_usage`` is set."""
    return {
        "id": meta.response_id,
        "object": meta.chunk_object,
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage.to_dict(),
    }


def full_response(
    meta: ResponseMeta, choices: Sequence[ChoiceResult], usage: Usage
) -> dict[str, Any]:
    """A non-streaming completion or chat completion, its ``choices`` in index order."""
    bodies: list[dict[str, Any]] = []
    for result in sorted(choices, key=lambda c: c.index):
        body: dict[str, Any]
        if meta.chat:
            message = {"role": "assistant", "content": result.text}
            body = {"index": result.index, "message": message, "logprobs": result.logprobs}
        else:
            body = {"index": result.index, "text": result.text, "logprobs": result.logprobs}
        body["finish_reason"] = result.finish_reason
        bodies.append(body)
    return {
        "id": meta.response_id,
        "object": meta.object,
        "created": meta.created,
        "model": meta.model,
        "choices": bodies,
        "usage": usage.to_dict(),
    }

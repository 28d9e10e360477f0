"""Request bodies of the OpenAI-compatible API (the subset this server honours).

Models are strict (no silent coercion of ``"5"`` to 5) and ignore unknown fields, as OpenAI
clients send extras. Field constraints produce 400 errors that name the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

_STRICT = ConfigDict(strict=True, extra="ignore")
MAX_STOP_STRINGS = 4


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = _STRICT

    model: StrictStr
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = None
    n: Literal[1] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of one string, or a list of
    token ids. ``max_tokens`` defaults to 16, as OpenAI's."""

    prompt: StrictStr | list[StrictStr] | list[int]

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], str) and len(value) != 1:
                raise ValueError("only one prompt per request is supported")
        if value == "" or value == [""]:
            raise ValueError("prompt must not be empty")
        return value


class TextPart(BaseModel):
    model_config = _STRICT

    type: Literal["text"]
    text: StrictStr


class ChatMessage(BaseModel):
    model_config = _STRICT

    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``: at least one message; ``max_completion_tokens`` is
    accepted as OpenAI's newer name for ``max_tokens``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

"""Request bodies of the OpenAI-compatible API: every field this server honours, no other.

Models are strict (no silent coercion of ``"5"`` to 5) and forbid unknown fields: a field
the server would not honour is answered with a 400 naming it, never dropped. Fields whose
only honoured value is OpenAI's default (``n``, the penalties) accept that value alone.
Field constraints produce 400 errors that name the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    field_validator,
)

from tokenpace.core.sampling import MIN_REPETITION_PENALTY

_STRICT = ConfigDict(strict=True, extra="forbid")
MAX_STOP_STRINGS = 4
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20  # as vLLM's default max_logprobs
# Sequences one response may carry (prompts x n): OpenAI's bound on n.
MAX_CHOICES = 128

PromptField = str | list[str] | list[int] | list[list[int]]


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _SamplingFields(BaseModel):
    """Fields shared by completions and chat completions. ``model`` may be left out (the
    served model), as vLLM's server allows. ``ignore_eos``, ``min_tokens``, ``top_k`` (0 or
    -1: all tokens) and ``min_p`` are vLLM's extensions that benchmark clients send;
    ``logit_bias`` maps token ids (as strings, OpenAI's form) to biases in [-100, 100];
    ``presence_penalty`` and ``frequency_penalty`` (OpenAI's, in [-2, 2]) and
    ``repetition_penalty`` (vLLM's, in [0.01, 2]) penalise tokens already seen;
    ``stop_token_ids`` (vLLM's) end the request when generated;
    ``user`` is an end-user id for the operator's logs and changes nothing in the output."""

    model_config = _STRICT

    model: StrictStr | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] = 0
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    logit_bias: dict[StrictStr, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    seed: int | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    ignore_eos: StrictBool = False
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    repetition_penalty: Annotated[float, Field(ge=MIN_REPETITION_PENALTY, le=2.0)] = 1.0
    stop_token_ids: Annotated[list[int], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    user: StrictStr | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return value

    def conflict(self) -> tuple[str, str] | None:
        """(param, message) for fields valid alone but not together, else None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "'stream_options' is only allowed when 'stream' is true"
        return None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous usage stats: every chunk carries its choice's usage so far
        (with ``include_usage`` only, as vLLM reads them)."""
        options = self.stream_options
        return options is not None and options.include_usage and options.continuous_usage_stats

    @property
    def num_logprobs(self) -> int | None:
        """Most likely alternatives to report per output token (None: no logprobs)."""
        return None

    @property
    def num_prompt_logprobs(self) -> int | None:
        """Alternatives to report per prompt token (None: no prompt logprobs)."""
        return None


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of token ids, or a batch:
    a list of strings or of token-id lists (as evaluation harnesses send them). Each prompt
    gets ``n`` choices, indexed ``prompt_index * n + sample``, as OpenAI and vLLM number
    them. ``max_tokens`` defaults to 16, as OpenAI's. ``logprobs``: how many most likely
    alternatives to report per token (0: the chosen token's alone); ``echo``: the prompt
    precedes the output (with its logprobs when ``logprobs`` is set)."""

    prompt: StrictStr | list[StrictStr] | list[int] | list[list[int]]
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: StrictBool = False

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: PromptField) -> PromptField:
        if isinstance(value, str):
            if not value:
                raise ValueError("prompt must not be empty")
            return value
        if not value:
            raise ValueError("prompt must not be empty")
        if isinstance(value[0], (str, list)):
            if any(not p for p in value):
                raise ValueError("no prompt in the batch may be empty")
            if len(value) > MAX_CHOICES:
                raise ValueError(f"at most {MAX_CHOICES} prompts are allowed in one request")
        return value

    @property
    def num_prompts(self) -> int:
        """Prompts in the request (a batch's length; 1 for a string or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], (str, list)):
            return len(prompt)
        return 1

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        return self.logprobs if self.echo else None


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
    accepted as OpenAI's newer name for ``max_tokens``. ``logprobs``: report each output
    token's logprob; ``top_logprobs``: with it, how many most likely alternatives."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None

    def conflict(self) -> tuple[str, str] | None:
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "'top_logprobs' needs 'logprobs' set to true"
        return super().conflict()

    @property
    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

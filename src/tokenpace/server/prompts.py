"""Request prompts to token ids, as completions, chat and ``/tokenize`` read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from tokenpace.server.errors import ApiError
from tokenpace.server.schemas import ChatMessage, PromptField


def longest_prompt_chars(prompt: PromptField) -> int:
    """Characters of a text prompt, or of the longest text prompt of a batch (0 for token
    ids): each prompt of a batch is a request of its own, held to the context alone."""
    if isinstance(prompt, str):
        return len(prompt)
    return max((len(p) for p in prompt if isinstance(p, str)), default=0)


def max_token_chars(tokenizer: Any) -> int:
    """The most characters any vocabulary token's text has (its byte-level form, which is
    never shorter than what it decodes to)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max((len(t) for t in tokens if t is not None), default=1)


def completion_prompt_ids(
    tokenizer: Any, prompt: str | list[str] | list[int], add_special_tokens: bool = True
) -> list[int]:
    """Token ids of a completions ``prompt`` (a string, a list of one string, or token ids,
    which must lie in the vocabulary: else ApiError(400) naming ``prompt``)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
    if prompt and isinstance(prompt[0], str):
        return list(tokenizer.encode(prompt[0], add_special_tokens=add_special_tokens))
    ids = [int(t) for t in prompt]
    vocab = len(tokenizer)
    if any(not 0 <= t < vocab for t in ids):
        raise ApiError(400, f"'prompt' token ids must be in [0, {vocab})", param="prompt")
    return ids


def completion_prompts(tokenizer: Any, prompt: PromptField) -> list[list[int]]:
    """Token ids of each prompt of a completions ``prompt``: one for a string or token ids,
    one per element of a batch (strings or token-id lists). Raises ApiError(400) naming
    ``prompt`` for token ids outside the vocabulary."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return [completion_prompt_ids(tokenizer, one) for one in prompt]
    return [completion_prompt_ids(tokenizer, cast(str | list[int], prompt))]


def chat_prompt_ids(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    add_generation_prompt: bool = True,
    add_special_tokens: bool = False,
) -> list[int]:
    """Token ids of ``messages`` rendered by the model's chat template (which places the
    special tokens; ``add_special_tokens`` adds the tokenizer's own on top)."""
    rendered = [{"role": m.role, "content": m.text()} for m in messages]
    text = tokenizer.apply_chat_template(
        rendered, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))

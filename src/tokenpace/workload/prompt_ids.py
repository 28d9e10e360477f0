"""Prompt token ids for requests that come with a length (and maybe text) only.

The one synthetic-prompt generator of tokenpace: benchmarks, profiling sweeps and start-up
calibration all draw their prompts here, so every engine sees the same token ids for the
same request. Step time depends on the number of tokens, not on which ones, so the ids only
need to be valid (inside every supported vocabulary) and distinct between requests (so no
prefix cache shortcut applies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

FIRST_ID = 1000
SPAN = 20000  # ids FIRST_ID .. FIRST_ID + SPAN - 1: inside any vocabulary of 32k and more

Encode = Callable[[str], Sequence[int]]


def synthetic_prompt_ids(num_tokens: int, seed: int, first: int = 0) -> list[int]:
    """``num_tokens`` token ids, deterministic in ``seed`` (e.g. the request id), for
    positions ``first .. first + num_tokens - 1`` of the prompt."""
    return [FIRST_ID + (seed * 7919 + i) % SPAN for i in range(first, first + num_tokens)]


def prompt_ids(num_tokens: int, seed: int, text: str | None, encode: Encode | None) -> list[int]:
    """A prompt of exactly ``num_tokens`` ids: ``text`` encoded, cut to that length or padded
    with synthetic ids (workloads count prompt tokens with their own tokenizer), or
    synthetic ids alone when there is no text. Raises ValueError for text without an
    ``encode`` (a random-weight model has no tokenizer)."""
    if text is None:
        return synthetic_prompt_ids(num_tokens, seed)
    if encode is None:
        raise ValueError("this model has no tokenizer (random weights); give a length only")
    ids = [int(i) for i in encode(text)][:num_tokens]
    return ids + synthetic_prompt_ids(num_tokens - len(ids), seed, first=len(ids))

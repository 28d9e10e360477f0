"""Early stops: the end-of-sequence token and stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenpace.core.sampling import SamplingParams

# Extra tokens decoded before the stop string's own length: tokens that decode to partial
# UTF-8 characters (or nothing) must not hide a stop string that straddles them.
_TAIL_MARGIN_TOKENS = 4


def should_stop(
    tokenizer: Any,
    eos_token_ids: frozenset[int],
    params: SamplingParams,
    output_token_ids: Sequence[int],
    new_token_id: int,
) -> bool:
    """True when ``new_token_id`` ends generation: it is one of ``params.stop_token_ids``,
    an EOS token (unless ``params.ignore_eos``), or the output text, with it appended, now
    contains a stop string that the text before it did not. Only the tail of the output is
    decoded: a stop string of n characters ending in the new token spans at most n tokens.
    Nothing ends generation before ``params.min_tokens`` output tokens (counted from the
    start of the whole generation, ``first_output_index`` included)."""
    if params.first_output_index + len(output_token_ids) + 1 < params.min_tokens:
        return False
    if new_token_id in params.stop_token_ids:
        return True
    if new_token_id in eos_token_ids and not params.ignore_eos:
        return True
    if not params.stop:
        return False
    longest = max(len(s) for s in params.stop)
    tail = list(output_token_ids[-(longest + _TAIL_MARGIN_TOKENS) :])
    before = tokenizer.decode(tail, skip_special_tokens=False)
    after = tokenizer.decode([*tail, new_token_id], skip_special_tokens=False)
    return any(stop in after and stop not in before for stop in params.stop)

"""Log-probabilities an engine reports for a token, for OpenAI's ``logprobs``."""

from __future__ import annotations

from dataclasses import dataclass

# JSON has no -inf: a log-probability below this is reported as this (as vLLM does).
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The natural-log probability of ``token_id`` at its position under the model's raw
    (untempered) distribution, and the ``top`` most likely tokens there as
    ``(token_id, logprob)`` pairs, most likely first (empty when none were asked for)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()

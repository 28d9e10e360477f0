"""Service-level objectives that define goodput."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpace.core.config import option
from tokenpace.engine.profile import EngineProfile

# tokenpace bench's default objectives, set for the reference profile (the paper's platform).
DEFAULT_TTFT_MS = 2000.0
DEFAULT_TPOT_MS = 100.0


@dataclass(frozen=True, slots=True)
class Slo:
    """A completed request meets the SLO if TTFT <= ``ttft_ms`` and TPOT <= ``tpot_ms``
    (either may be None: not checked)."""

    ttft_ms: float | None = option(DEFAULT_TTFT_MS, "TTFT objective (ms).")
    tpot_ms: float | None = option(DEFAULT_TPOT_MS, "TPOT objective (ms).")

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")


def tpot_scale(profile: EngineProfile, reference: EngineProfile) -> float:
    """How much slower ``profile``'s l_min is than ``reference``'s, never below 1: the
    scale of the TPOT objective (a decode step)."""
    return max(1.0, profile.l_min_ms / reference.l_min_ms)


def ttft_scale(profile: EngineProfile, reference: EngineProfile) -> float:
    """The scale of the TTFT objective: the larger of ``tpot_scale`` (the l_min ratio) and
    how much slower ``profile`` prefills a token than ``reference`` (a first token waits in
    the queue, paced by steps, then for its prompt's prefill), never below 1."""
    prefill = (
        profile.prefill_ms_per_token / reference.prefill_ms_per_token
        if reference.prefill_ms_per_token > 0
        else 1.0
    )
    return max(tpot_scale(profile, reference), prefill)


def scaled_slo(
    profile: EngineProfile,
    reference: EngineProfile,
    ttft_ms: float | None = None,
    tpot_ms: float | None = None,
) -> Slo:
    """The default SLO (``DEFAULT_TTFT_MS``, ``DEFAULT_TPOT_MS``, set for ``reference``)
    scaled to ``profile``: TTFT by ``ttft_scale`` (step time and prefill cost), TPOT by
    ``tpot_scale`` (step time). An engine slower than the reference gets objectives looser
    in proportion, a faster one keeps the defaults. An objective given (ms) is kept as
    is."""
    default_ttft = DEFAULT_TTFT_MS * ttft_scale(profile, reference)
    default_tpot = DEFAULT_TPOT_MS * tpot_scale(profile, reference)
    return Slo(
        ttft_ms=ttft_ms if ttft_ms is not None else default_ttft,
        tpot_ms=tpot_ms if tpot_ms is not None else default_tpot,
    )

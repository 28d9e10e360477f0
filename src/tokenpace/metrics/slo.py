"""Service-level objectives that define goodput."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpace.core.config import option


@dataclass(frozen=True, slots=True)
class Slo:
    """A completed request meets the SLO if TTFT <= ``ttft_ms`` and TPOT <= ``tpot_ms``
    (either may be None: not checked)."""

    ttft_ms: float | None = option(2000.0, "TTFT objective (ms).")
    tpot_ms: float | None = option(100.0, "TPOT objective (ms).")

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")

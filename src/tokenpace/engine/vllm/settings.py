"""How a vLLM server picks its tokenpace policy: environment variables, read once at start.

vLLM builds the scheduler itself (in the engine-core process), so the choice travels in the
environment, which that process inherits:

- ``TOKENPACE_POLICY``: a registered policy name (default ``twp``).
- ``TOKENPACE_PROFILE``: a shipped profile name or a profile JSON path (default
  ``v100-llama-3.2-3b``); its latency facts parameterise the policy, while the KV block size
  and count always come from vLLM's own cache.
- ``TOKENPACE_SLO_TTFT_MS`` / ``TOKENPACE_SLO_TPOT_MS``: the SLO given to SLO-targeted
  policies (defaults: tokenpace's ``Slo()``).
- ``TOKENPACE_STEP_LOG``: optional path of a JSON-lines file receiving one record per step.
- ``TOKENPACE_STEP_LOG_MAX``: how many step records the scheduler keeps in memory (100000).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenpace.core.config import option, require_positive
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES

ENV_POLICY = "TOKENPACE_POLICY"
ENV_PROFILE = "TOKENPACE_PROFILE"
ENV_SLO_TTFT_MS = "TOKENPACE_SLO_TTFT_MS"
ENV_SLO_TPOT_MS = "TOKENPACE_SLO_TPOT_MS"
ENV_STEP_LOG = "TOKENPACE_STEP_LOG"
ENV_STEP_LOG_MAX = "TOKENPACE_STEP_LOG_MAX"

DEFAULT_POLICY = "twp"
DEFAULT_PROFILE = "v100-llama-3.2-3b"


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The tokenpace side of a vLLM scheduler. Validated on construction."""

    policy: str = option(DEFAULT_POLICY, "Registered policy name (twp, fcfs, ...).")
    profile: str = option(DEFAULT_PROFILE, "Shipped profile name or profile JSON path.")
    slo: Slo = option(Slo(), "SLO handed to SLO-targeted policies.")
    step_log_path: Path | None = option(None, "JSON-lines file for per-step records.")
    max_step_records: int = option(100_000, "Step records kept in memory (oldest dropped).")

    def __post_init__(self) -> None:
        require_positive(self, "max_step_records")
        if self.policy not in POLICIES:
            raise ValueError(
                f"SchedulerSettings.policy {self.policy!r} is not registered; "
                f"valid choices: {', '.join(POLICIES.names())}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SchedulerSettings:
        """Settings from ``environ`` (pass ``os.environ``); unset or empty variables take the
        defaults. Raises ValueError naming the variable for a malformed value."""
        max_records = int(_number(environ, ENV_STEP_LOG_MAX, 100_000) or 0)
        default_slo = Slo()
        slo = Slo(
            ttft_ms=_number(environ, ENV_SLO_TTFT_MS, default_slo.ttft_ms),
            tpot_ms=_number(environ, ENV_SLO_TPOT_MS, default_slo.tpot_ms),
        )
        log_path = environ.get(ENV_STEP_LOG) or None
        return cls(
            policy=environ.get(ENV_POLICY) or DEFAULT_POLICY,
            profile=environ.get(ENV_PROFILE) or DEFAULT_PROFILE,
            slo=slo,
            step_log_path=Path(log_path) if log_path else None,
            max_step_records=max_records,
        )


def _number(environ: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if name == ENV_STEP_LOG_MAX and not value.is_integer():
        raise ValueError(f"{name} must be an integer, got {raw!r}")
    return value

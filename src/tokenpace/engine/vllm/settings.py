"""How a vLLM server picks its tokenpace policy: environment variables, read once at start.

vLLM builds the scheduler itself (in the engine-core process), so the choice travels in the
environment, which that process inherits:

- ``TOKENPACE_POLICY``: a registered policy name (default ``twp``).
- ``TOKENPACE_PROFILE``: a shipped profile name or a profile JSON path (default
  ``v100-llama-3.2-3b``); its latency facts parameterise the policy, while the KV block size
  and count always come from vLLM's own cache.
- ``TOKENPACE_STEP_LOG``: optional path of a JSON-lines file receiving one record per step.
- ``TOKENPACE_STEP_LOG_MAX``: how many step records the scheduler keeps in memory (100000).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenpace.core.config import option, require_positive
from tokenpace.policy import POLICIES

ENV_POLICY = "TOKENPACE_POLICY"
ENV_PROFILE = "TOKENPACE_PROFILE"
ENV_STEP_LOG = "TOKENPACE_STEP_LOG"
ENV_STEP_LOG_MAX = "TOKENPACE_STEP_LOG_MAX"

DEFAULT_POLICY = "twp"
DEFAULT_PROFILE = "v100-llama-3.2-3b"


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The tokenpace side of a vLLM scheduler. Validated on construction."""

    policy: str = option(DEFAULT_POLICY, "Registered policy name (twp, fcfs, ...).")
    profile: str = option(DEFAULT_PROFILE, "Shipped profile name or profile JSON path.")
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
        raw_max = environ.get(ENV_STEP_LOG_MAX) or "100000"
        try:
            max_records = int(raw_max)
        except ValueError:
            raise ValueError(f"{ENV_STEP_LOG_MAX} must be an integer, got {raw_max!r}") from None
        log_path = environ.get(ENV_STEP_LOG) or None
        return cls(
            policy=environ.get(ENV_POLICY) or DEFAULT_POLICY,
            profile=environ.get(ENV_PROFILE) or DEFAULT_PROFILE,
            step_log_path=Path(log_path) if log_path else None,
            max_step_records=max_records,
        )

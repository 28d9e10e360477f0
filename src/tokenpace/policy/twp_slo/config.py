"""Parameters of the SLO-targeted TWP mode; each of its changes can be switched off."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.policy.twp.config import TwpConfig


@dataclass(frozen=True, slots=True)
class TwpSloConfig:
    """``base`` carries TWP's monitor and KV-guard settings (EMA factor, gain, d_kv rule);
    the latency terms come from the engine profile, the objectives from the SLO."""

    base: TwpConfig = field(default_factory=TwpConfig, metadata={"help": "TWP monitor/guard."})
    alpha_ms: float = option(1.0, "Per-request latency slope beyond B0 (ms), from the profile.")
    prefill_ms_per_token: float = option(0.15, "Prefill cost per token (ms), from the profile.")
    mixed_prefill_overhead_ms: float = option(3.0, "Cost of mixing prefill into a decode step.")
    ttft_slo_ms: float = option(2000.0, "TTFT objective (ms).")
    tpot_slo_ms: float = option(100.0, "TPOT objective (ms).")
    # The prefill budget caps every step's predicted latency at the target, and the
    # calibration removes the profile's systematic error, so the margin below the objective
    # only has to cover step-time noise: 5% is 3.3 standard deviations of the reference
    # profile's 1.5% jitter, so the p99 of ITL, not only its mean, stays under the
    # objective. ``from_profile`` widens the margin to 3.3 standard deviations of a noisier
    # profile's jitter (``itl_target_fraction_for``).
    itl_target_fraction: float = option(0.95, "ITL target as a fraction of the TPOT objective.")
    max_window_requests: int = option(512, "Upper clamp of the request window.")
    # 600 steps is about 48 s at the 80 ms target: long enough that infeasible requests
    # yield to feasible ones under overload, still a hard bound on every wait while
    # force-admitted requests hold less than max_forced_share of the window.
    max_wait_steps: int = option(600, "Steps after which a waiting request is force-admitted.")
    # Under sustained overload some request has always waited max_wait_steps: without a
    # bound, force-admissions (first come, first served over requests already late) take
    # every slot and the deadline ranking never runs (the whole Azure conversation trace
    # at 1.2x its knee: 6.9% SLO attainment). Each forced slot is one taken from requests
    # that can still meet their objectives; on that trace (3 seeds) goodput fell from 2.59
    # req/s at one slot to 2.51 at 0.05, 2.35 at 0.10 and 1.84 at 0.25, at the same p99 TTFT.
    max_forced_share: float = option(
        0.05,
        "Most of the window's request slots that force-admitted requests hold at once (at "
        "least one); the rest stay with the deadline ranking, which still serves waiting "
        "requests past max_wait_steps behind the feasible ones. 1 lets them take any room.",
    )
    min_prefill_tokens: int = option(
        64, "Chunk the window keeps headroom for (and fixed C per request when the budget is off)."
    )
    max_prefill_tokens: int = option(2048, "Prefill budget ceiling per step (tokens).")
    use_itl_target: bool = option(True, "Slowdown against the ITL target instead of l_min.")
    use_deadline_ranking: bool = option(True, "Rank feasible-TTFT requests first (EDF).")
    use_prefill_budget: bool = option(True, "Prefill tokens from ITL headroom, not fixed C.")
    use_profile_window: bool = option(True, "Size the window from the profile (Eq. 2).")
    use_balance_floor: bool = option(
        True,
        "The window never below the batch at which decode and prefill keep pace under the "
        "ITL target (window.balanced_batch), once a prompt and an output token are seen.",
    )
    mix_ema: float = option(
        0.05, "Weight of the newest admitted request in the mean prompt and max_tokens."
    )
    use_deferral: bool = option(
        True, "Overload-aware order: defer the longest prompts that would make others late."
    )
    # Off by default: under overload, earliest deadline first serves every on-time request
    # near the end of its objective; an aim shortens those waits (TTFT p50 and mean QoE)
    # and pays in goodput and in the wait of the requests it passes over (p99 TTFT). On the
    # six pool scenarios (10 seeds), aims of 0.5, 0.6, 0.7, 0.8 and 0.9 raised the mean QoE
    # on ``high`` from 0.747 to 0.866, 0.871, 0.853, 0.822 and 0.785 at 2.2%, 1.3%, 1.0%,
    # 1.2% and 0.3% less goodput, and took ``medium``'s p99 TTFT from 4.07 s to 5.44, 5.11,
    # 5.02, 4.69 and 4.39 s (docs/architecture.md). ``twp_slo-ttft_aim`` runs 0.7.
    ttft_aim_fraction: float = option(
        1.0,
        "Under overload (deadline ranking with deferral), requests that can still get their "
        "first token within this fraction of the TTFT objective go first "
        "(deadline.deadline_order); 1 switches it off.",
    )
    use_late_yield: bool = option(
        True,
        "A prefilling request that can no longer meet the TTFT objective yields the step's "
        "prefill budget to the requests that still can (deadline ranking only).",
    )
    use_output_estimate: bool = option(
        True, "Expected output from finished requests, not max_tokens, for KV and ranking."
    )
    use_kv_reservation: bool = option(
        True, "Admit against the batch's predicted KV footprint instead of the d_kv guard."
    )
    # On by default: where a real engine's steps vary more than its profile says it holds
    # p99 ITL at the objective, at the price of the paced capacity a lower target costs;
    # where at most 0.5% of those gaps pass, it moves nothing (docs/architecture.md has the
    # measurements).
    use_tail_margin: bool = option(
        True,
        "Widen the ITL target's margin below the TPOT objective while serving, until 0.5% of "
        "the inter-token gaps of full steps pass the objective (tail_margin.py); never "
        "narrower than itl_target_fraction's.",
    )
    # Off by default: a server that rejects trades requests for the latency of the rest,
    # a choice its operator makes (rejection.py says how the miss is predicted).
    early_reject: bool = option(
        False,
        "Reject (HTTP 429 in serve) a request not yet started whose predicted time to first "
        "token (wait so far + window wait + prefill) exceeds the TTFT objective.",
    )
    compiled_deferrals: bool = option(
        True,
        "Moore and Hodgson's deferrals (use_deferral) in one compiled loop (numba) where numba "
        "is installed: the same order, without a Python heap operation per waiting request.",
    )

    def __post_init__(self) -> None:
        require_positive(
            self, "ttft_slo_ms", "tpot_slo_ms", "itl_target_fraction", "max_window_requests",
            "max_wait_steps", "min_prefill_tokens", "max_prefill_tokens", "mix_ema",
        )  # fmt: skip
        if self.mix_ema > 1:
            raise ValueError(f"mix_ema must be <= 1, got {self.mix_ema}")
        if not 0 < self.max_forced_share <= 1:
            raise ValueError(f"max_forced_share must be in (0, 1], got {self.max_forced_share}")
        if not 0 < self.ttft_aim_fraction <= 1:
            raise ValueError(f"ttft_aim_fraction must be in (0, 1], got {self.ttft_aim_fraction}")
        if self.itl_target_fraction > 1:
            raise ValueError(f"itl_target_fraction must be <= 1, got {self.itl_target_fraction}")
        if self.min_prefill_tokens > self.max_prefill_tokens:
            raise ValueError("min_prefill_tokens exceeds max_prefill_tokens")

    @property
    def itl_target_ms(self) -> float:
        return self.itl_target_fraction * self.tpot_slo_ms

    @property
    def ttft_aim_s(self) -> float | None:
        """The aim for the first token under overload (s); None when switched off."""
        if self.ttft_aim_fraction >= 1:
            return None
        return self.ttft_aim_fraction * self.ttft_slo_ms / 1000

    @classmethod
    def from_profile(cls, profile: EngineProfile, slo: Slo, **overrides: Any) -> TwpSloConfig:
        """The configuration for ``profile`` and ``slo``: the profile's latency terms, and
        the ITL target's margin wide enough for the profile's step noise."""
        return replace(
            cls(
                base=TwpConfig.from_profile(profile),
                itl_target_fraction=itl_target_fraction_for(profile),
                alpha_ms=profile.alpha_ms,
                prefill_ms_per_token=profile.prefill_ms_per_token,
                mixed_prefill_overhead_ms=profile.mixed_prefill_overhead_ms,
                ttft_slo_ms=slo.ttft_ms if slo.ttft_ms is not None else 1e12,
                tpot_slo_ms=slo.tpot_ms if slo.tpot_ms is not None else 1e12,
            ),
            **overrides,
        )


NOISE_MARGIN_SIGMAS = 3.3  # standard deviations of step noise between the target and the TPOT
MAX_ITL_TARGET_FRACTION = 0.95
MIN_ITL_TARGET_FRACTION = 0.5


def itl_target_fraction_for(profile: EngineProfile) -> float:
    """The ITL target as a fraction of the TPOT objective for ``profile``: 0.95, or lower
    when ``NOISE_MARGIN_SIGMAS`` standard deviations of its step noise (``noise_cv``) need
    a wider margin (the CPU engines here measured 6% against the reference's 1.5%); never
    below 0.5."""
    return itl_target_fraction_for_noise(profile.noise_cv)


def itl_target_fraction_for_noise(noise_cv: float) -> float:
    """``itl_target_fraction_for`` a step noise of ``noise_cv`` (relative standard
    deviation)."""
    fraction = 1.0 - NOISE_MARGIN_SIGMAS * noise_cv
    return max(MIN_ITL_TARGET_FRACTION, min(MAX_ITL_TARGET_FRACTION, fraction))

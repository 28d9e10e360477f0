"""TWP's parameters, with the paper's defaults and a reason for every value it leaves open."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tokenpace.core.config import option, require_positive
from tokenpace.engine.profile import EngineProfile
from tokenpace.policy.output_length import OutputLengthConfig


@dataclass(frozen=True, slots=True)
class TwpConfig:
    """Every TWP parameter. ``l_min_ms`` and ``b0`` come from the engine profile
    (``from_profile``); the rest default to the paper's values or to the choices argued in
    the comments below."""

    l_min_ms: float = option(43.0, "Baseline decode step latency l_min (ms), from the profile.")
    b0: int = option(8, "Saturation batch size B0, from the profile.")
    h0_tokens: float = option(400.0, "Nominal token window H0 = B0 x mean output (paper: 400).")
    gain: float = option(0.15, "Control gain g of the window update (paper: 0.15).")
    chunk_tokens: int = option(64, "Prefill chunk C: prompt tokens per request per step (64).")
    # One EMA step weighs the newest ITL by 0.2: a 5-step time constant filters the 1-2% step
    # jitter and one-step prefill spikes, yet reacts well inside the ~7-step horizon g implies.
    ema_factor: float = option(0.2, "Weight of the newest step latency in the smoothed ITL.")
    # Q = 2 x B0 requests: the window reaches its full 2x expansion when two batches' worth of
    # requests wait; a shorter queue expands it proportionally.
    queue_norm: float = option(16.0, "Queue depth Q (requests) at which the queue term saturates.")
    # H_min = H0 / 2 keeps about B0/2 mean requests admissible however high ITL goes, so the
    # batch never collapses to one request; H_max = 2 x H0 bounds the quiet-period expansion
    # (max(0.5, s) alone allows 4 x H0) so a burst lands on a window that still respects B0.
    h_min_tokens: float = option(200.0, "Lower clamp of the token window (tokens).")
    h_max_tokens: float = option(800.0, "Upper clamp of the token window (tokens).")
    # T_max = 100 steps is about 4.3 s at l_min = 43 ms: long enough that the gate, not the
    # force-admit path, paces admission at the paper's loads, short enough to bound the tail.
    t_max_steps: int = option(100, "Steps after which a waiting request is force-admitted.")
    # Weights w1 > w2 > w3 as the paper orders them. Each term lies in [0, 1]; a request
    # near T_max (starvation ~1) outranks any balance + fairness sum (at most 0.75).
    w_starvation: float = option(1.0, "w1: weight of starvation (steps waited / T_max).")
    w_balance: float = option(0.5, "w2: weight of token balance T(r) (Eq. 5).")
    w_fairness: float = option(0.25, "w3: weight of fairness (wait / job size, normalised).")
    # d_kv = floor + horizon x (blocks consumed per step, smoothed), within [floor, cap]: when
    # blocks are consumed fast the guard keeps enough free to absorb `horizon` more steps of
    # that growth; when usage is stable or falling it relaxes to the floor.
    kv_floor_frac: float = option(0.02, "d_kv floor as a fraction of all KV blocks.")
    kv_cap_frac: float = option(0.25, "d_kv ceiling as a fraction of all KV blocks.")
    kv_horizon_steps: float = option(32.0, "Steps of current block consumption d_kv reserves.")
    kv_rate_ema: float = option(0.3, "Weight of the newest step in the block-consumption EMA.")
    output_lengths: OutputLengthConfig = field(
        default_factory=OutputLengthConfig,
        metadata={"help": "How output lengths are learned from finished requests."},
    )
    use_output_estimate: bool = option(
        True, "Expected output from finished requests, not max_tokens, in K_t, gate and rank."
    )
    use_kv_reservation: bool = option(
        True, "Admit only while the batch's predicted KV footprint fits (no recompute)."
    )
    # One standard deviation: on bench/kv_reservation.py's KV-bound workload (10 seeds) it
    # recomputed 6% of vllm_default's tokens at 0.48 req/s goodput; 2 recomputed 2% at 0.45,
    # 0 recomputed 13% at 0.53.
    kv_margin_sigmas: float = option(
        1.0, "KV reservation margin, in standard deviations of the forecast occupancy."
    )
    compiled_ranking: bool = option(
        True,
        "Rank a long queue in a compiled loop (numba) where numba is installed and its exp "
        "is numpy's: the same order as numpy.",
    )

    def __post_init__(self) -> None:
        require_positive(
            self,
            "l_min_ms",
            "b0",
            "h0_tokens",
            "gain",
            "chunk_tokens",
            "ema_factor",
            "queue_norm",
            "h_min_tokens",
            "h_max_tokens",
            "t_max_steps",
            "kv_rate_ema",
        )
        if self.kv_margin_sigmas < 0:
            raise ValueError(
                f"TwpConfig.kv_margin_sigmas must be >= 0, got {self.kv_margin_sigmas}"
            )
        if not self.gain <= 1:
            raise ValueError(f"TwpConfig.gain must be in (0, 1], got {self.gain}")
        if not self.ema_factor <= 1:
            raise ValueError(f"TwpConfig.ema_factor must be in (0, 1], got {self.ema_factor}")
        if self.h_min_tokens > self.h_max_tokens:
            raise ValueError(
                f"TwpConfig.h_min_tokens ({self.h_min_tokens}) exceeds h_max_tokens "
                f"({self.h_max_tokens})"
            )
        if not self.w_starvation > self.w_balance > self.w_fairness >= 0:
            raise ValueError(
                "TwpConfig weights must satisfy w_starvation > w_balance > w_fairness >= 0, got "
                f"{self.w_starvation}, {self.w_balance}, {self.w_fairness}"
            )
        if not 0 <= self.kv_floor_frac <= self.kv_cap_frac < 1:
            raise ValueError(
                f"TwpConfig needs 0 <= kv_floor_frac <= kv_cap_frac < 1, got "
                f"{self.kv_floor_frac}, {self.kv_cap_frac}"
            )

    @classmethod
    def from_profile(cls, profile: EngineProfile, **overrides: Any) -> TwpConfig:
        """Defaults with l_min and B0 taken from ``profile``, then ``overrides`` applied."""
        return replace(cls(l_min_ms=profile.l_min_ms, b0=profile.b0), **overrides)

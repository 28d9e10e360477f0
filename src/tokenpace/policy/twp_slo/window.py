"""A window in requests that seeks the ITL target.

Eq. 2 makes step latency a function of the batch size, so the window counts requests: the
batch at which the profile predicts the ITL target is B* = B0 + (target - l_min - reserve) /
alpha, the reserve being one minimum prefill chunk plus the mixing cost. Feedback: s = l^ /
l_ref and W* = W_base / max(0.5, s), W <- W + g (W* - W), clamped to [B0, max]. W_base is B*
(profile sizing) or the current window (measured sizing: integral action until the measured ITL
sits at l_ref). l_ref is the ITL target, or l_min when that change is off.

B* keeps one minimum prefill chunk beside the window's decodes in every step; where that
chunk and the mixing cost take most of the headroom (a CPU engine whose mixed steps cost
~17 ms and whose prompt tokens cost 0.46 ms each), B* falls to B0 and the engine idles with
a queue. So W_base never falls below the batch at which decode and prefill keep pace
(``balanced_batch``), once the workload's mean prompt and output are known (before any
request finishes, the output streamed so far stands in for the mean output).
"""

from __future__ import annotations

import math

from tokenpace.policy.twp_slo.config import TwpSloConfig


def profile_batch_target(cfg: TwpSloConfig) -> float:
    """B* from the profile; B0 when alpha is zero-free headroom is negative."""
    base = cfg.base
    reserve = cfg.mixed_prefill_overhead_ms + cfg.min_prefill_tokens * cfg.prefill_ms_per_token
    headroom = cfg.itl_target_ms - base.l_min_ms - reserve
    if cfg.alpha_ms <= 0:
        return float(cfg.max_window_requests)
    return float(min(cfg.max_window_requests, base.b0 + max(0.0, headroom) / cfg.alpha_ms))


def balanced_batch(
    cfg: TwpSloConfig, attention_ms_per_kctx: float, mean_prompt: float, mean_output: float
) -> float:
    """The batch B at which decode and prefill keep pace under the ITL target T. B requests
    decoding finish B / O requests a step (O: the mean output), whose replacements need
    B P / O prompt tokens a step (P: the mean prompt). Such a step costs l_min + alpha
    (B - B0) + a B + m + pi B P / O (a: one request's decode attention at the mean context
    P + O / 2; m: the mixing cost; pi: the prefill cost per token), so B = (T - l_min - m +
    alpha B0) / (alpha + a + pi P / O), within [B0, ``max_window_requests``]."""
    base = cfg.base
    attention = attention_ms_per_kctx * (mean_prompt + mean_output / 2) / 1000
    per_request = cfg.alpha_ms + attention + cfg.prefill_ms_per_token * mean_prompt / mean_output
    room = cfg.itl_target_ms - base.l_min_ms - cfg.mixed_prefill_overhead_ms
    room += cfg.alpha_ms * base.b0
    if per_request <= 0:
        return float(cfg.max_window_requests)
    return float(min(cfg.max_window_requests, max(base.b0, room / per_request)))


class RequestWindow:
    """Holds the smoothed ITL and the window W_t (requests)."""

    def __init__(self, cfg: TwpSloConfig) -> None:
        self.floor = 0.0
        self.retarget(cfg)
        self.window = self.nominal
        self.target = self.nominal
        self.smoothed_itl_ms: float | None = None

    def retarget(self, cfg: TwpSloConfig) -> None:
        """Take the reference ITL and the nominal window from ``cfg`` (a refitted profile's
        terms); the window moves toward the new nominal at the usual gain."""
        self.cfg = cfg
        self.reference_ms = cfg.itl_target_ms if cfg.use_itl_target else cfg.base.l_min_ms
        self.nominal = profile_batch_target(cfg) if cfg.use_profile_window else float(cfg.base.b0)

    @property
    def slowdown(self) -> float:
        itl = self.smoothed_itl_ms if self.smoothed_itl_ms is not None else self.reference_ms
        return itl / self.reference_ms

    def update(self, step_latency_s: float | None) -> float:
        cfg = self.cfg
        if step_latency_s is not None:
            latency_ms = step_latency_s * 1000
            if self.smoothed_itl_ms is None:
                self.smoothed_itl_ms = latency_ms
            else:
                self.smoothed_itl_ms += cfg.base.ema_factor * (latency_ms - self.smoothed_itl_ms)
        base = max(self.nominal, self.floor) if cfg.use_profile_window else self.window
        self.target = base / max(0.5, self.slowdown)
        moved = self.window + cfg.base.gain * (self.target - self.window)
        self.window = min(float(cfg.max_window_requests), max(float(cfg.base.b0), moved))
        return self.window

    def set_floor(self, batch: float) -> None:
        """The least W_base from the next update on (``balanced_batch``; 0: none)."""
        self.floor = batch

    def capacity(self) -> int:
        return max(self.cfg.base.b0, math.floor(self.window))

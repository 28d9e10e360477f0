"""Steps 1-2 of TWP: smooth the measured ITL and move the token window toward its target."""

from __future__ import annotations

from tokenpace.policy.twp.config import TwpConfig


class WindowController:
    """Holds the smoothed ITL l^_t and the token window H_t.

    ``update(latency, queue_depth)`` applies, in order: EMA smoothing of the step latency;
    slowdown s = l^/l_min; Eq. 3 target H* = H0 (1 + min(1, q/Q)) / max(0.5, s); Eq. 4
    H <- H + g (H* - H); clamp to [H_min, H_max]. With no measurement yet (first step) the
    smoothed ITL stays at l_min.
    """

    def __init__(self, config: TwpConfig) -> None:
        self.config = config
        self.smoothed_itl_ms = config.l_min_ms
        self.target_window = config.h0_tokens
        self.window = config.h0_tokens
        self._seen_latency = False

    @property
    def slowdown(self) -> float:
        return self.smoothed_itl_ms / self.config.l_min_ms

    def update(self, step_latency_s: float | None, queue_depth: int) -> float:
        cfg = self.config
        if step_latency_s is not None:
            latency_ms = step_latency_s * 1000.0
            if self._seen_latency:
                self.smoothed_itl_ms += cfg.ema_factor * (latency_ms - self.smoothed_itl_ms)
            else:
                self.smoothed_itl_ms = latency_ms
                self._seen_latency = True
        queue_term = 1.0 + min(1.0, queue_depth / cfg.queue_norm)
        self.target_window = cfg.h0_tokens * queue_term / max(0.5, self.slowdown)
        moved = self.window + cfg.gain * (self.target_window - self.window)
        self.window = min(cfg.h_max_tokens, max(cfg.h_min_tokens, moved))
        return self.window

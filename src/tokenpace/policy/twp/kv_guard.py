"""TWP's KV headroom guard: the free-block threshold d_kv adapts to the consumption rate."""

from __future__ import annotations

from tokenpace.policy.twp.config import TwpConfig


class KvHeadroomGuard:
    """Tracks blocks consumed per step (EMA of the change in used blocks) and sets
    d_kv = clamp(floor + horizon x max(0, rate), floor, cap), floor and cap being fractions
    of all blocks. A candidate passes if the free blocks left after reserving its whole
    footprint (prompt + max_tokens) still exceed d_kv."""

    def __init__(self, config: TwpConfig) -> None:
        self.config = config
        self.consumption_rate = 0.0
        self.threshold_blocks = 0.0
        self._last_used: int | None = None

    def update(self, num_used_blocks: int, num_total_blocks: int) -> float:
        cfg = self.config
        if self._last_used is not None:
            delta = num_used_blocks - self._last_used
            self.consumption_rate += cfg.kv_rate_ema * (delta - self.consumption_rate)
        self._last_used = num_used_blocks
        floor = cfg.kv_floor_frac * num_total_blocks
        cap = cfg.kv_cap_frac * num_total_blocks
        wanted = floor + cfg.kv_horizon_steps * max(0.0, self.consumption_rate)
        self.threshold_blocks = min(cap, max(floor, wanted))
        return self.threshold_blocks

    def admits(self, num_free_blocks: int, num_blocks_needed: int) -> bool:
        return num_free_blocks - num_blocks_needed > self.threshold_blocks

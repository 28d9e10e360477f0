"""d_kv adaptation worked by hand: 1,000 blocks, floor 2%, cap 25%, horizon 4, EMA 0.3."""

from __future__ import annotations

import pytest

from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard


def make_guard() -> KvHeadroomGuard:
    return KvHeadroomGuard(TwpConfig(kv_horizon_steps=4, kv_rate_ema=0.3))


def test_threshold_tightens_with_fast_consumption_and_relaxes_when_stable() -> None:
    guard = make_guard()
    assert guard.update(100, 1000) == pytest.approx(20.0)  # no rate yet: the floor
    # +50 blocks: rate 0.3 * 50 = 15 -> 20 + 4 * 15 = 80.
    assert guard.update(150, 1000) == pytest.approx(80.0)
    # stable: rate 15 + 0.3 * (0 - 15) = 10.5 -> 20 + 42 = 62.
    assert guard.update(150, 1000) == pytest.approx(62.0)
    # falling by 30: rate 10.5 + 0.3 * (-30 - 10.5) = -1.65 -> floor 20.
    assert guard.update(120, 1000) == pytest.approx(20.0)


def test_threshold_is_capped() -> None:
    guard = make_guard()
    guard.update(0, 1000)
    # +900: rate 270 -> 20 + 1080, capped at 250.
    assert guard.update(900, 1000) == pytest.approx(250.0)


def test_admits_only_when_free_blocks_after_the_footprint_exceed_the_threshold() -> None:
    guard = make_guard()
    guard.update(100, 1000)  # threshold 20
    assert guard.admits(num_free_blocks=100, num_blocks_needed=79)  # 21 left > 20
    assert not guard.admits(num_free_blocks=100, num_blocks_needed=80)  # 20 left

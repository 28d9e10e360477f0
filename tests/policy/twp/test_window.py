"""Eq. 3 / Eq. 4 with numbers worked by hand (H0 = 400, g = 0.15, Q = 16, l_min = 43 ms)."""

from __future__ import annotations

import pytest

from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.window import WindowController


def test_first_update_uses_the_measurement_then_eq3_and_eq4() -> None:
    controller = WindowController(TwpConfig())
    # l = 86 ms -> smoothed 86 (first sample), s = 2; q = 8 -> 1 + 0.5.
    # H* = 400 * 1.5 / 2 = 300; H = 400 + 0.15 * (300 - 400) = 385.
    assert controller.update(0.086, queue_depth=8) == pytest.approx(385.0)
    assert controller.target_window == pytest.approx(300.0)
    # l = 43 ms -> smoothed 86 + 0.2 * (43 - 86) = 77.4, s = 1.8; q = 16 -> 2.
    # H* = 800 / 1.8 = 444.444; H = 385 + 0.15 * 59.444 = 393.917.
    assert controller.update(0.043, queue_depth=16) == pytest.approx(393.9167, abs=1e-3)
    assert controller.smoothed_itl_ms == pytest.approx(77.4)
    assert controller.slowdown == pytest.approx(1.8)


def test_slowdown_floor_of_one_half_and_the_queue_term_saturate() -> None:
    controller = WindowController(TwpConfig(h_max_tokens=10_000))
    # 10 ms -> s = 0.2326, floored to 0.5; q = 100 -> min(1, 100/16) = 1.
    # H* = 400 * 2 / 0.5 = 1600; H = 400 + 0.15 * 1200 = 580.
    assert controller.update(0.010, queue_depth=100) == pytest.approx(580.0)
    assert controller.target_window == pytest.approx(1600.0)


def test_window_is_clamped_to_h_max_and_h_min() -> None:
    controller = WindowController(TwpConfig(h_min_tokens=350, h_max_tokens=420))
    for _ in range(20):
        controller.update(0.010, queue_depth=100)
    assert controller.window == 420.0
    for _ in range(200):
        controller.update(0.500, queue_depth=0)  # s ~ 11.6 -> H* ~ 34
    assert controller.window == 350.0


def test_no_measurement_keeps_smoothed_itl_at_l_min() -> None:
    controller = WindowController(TwpConfig())
    # s = 1, q = 0 -> H* = H0: the window stays at 400.
    assert controller.update(None, queue_depth=0) == pytest.approx(400.0)
    assert controller.smoothed_itl_ms == 43.0

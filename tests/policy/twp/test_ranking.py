"""Eq. 5 token balance and the composite score, worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.helpers import request, state
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.ranking import order_by_score, rank, token_balance


def test_token_balance_eq5() -> None:
    scores = token_balance(np.array([50, 20, 200]), mean_remaining=50.0)
    assert scores[0] == pytest.approx(1.0)
    assert scores[1] == pytest.approx(math.exp(-30 / 51))  # 0.5553
    assert scores[2] == pytest.approx(math.exp(-150 / 51))  # 0.0528


def test_composite_score_and_forced_set() -> None:
    cfg = TwpConfig(t_max_steps=10)
    # Step 8. A waited 8 steps, B 2 steps, C 12 steps (forced).
    a = request(0, prompt=30, max_tokens=20, arrival_s=0.0, enqueued_step=0)
    b = request(1, prompt=80, max_tokens=50, arrival_s=1.5, enqueued_step=6)
    c = request(2, prompt=70, max_tokens=30, arrival_s=0.0, enqueued_step=-4)
    snapshot = state([a, b, c], now_s=2.0, step_index=8)
    ranking = rank(snapshot.waiting, 2.0, 8, mean_remaining=50.0, cfg=cfg)
    assert ranking.forced.tolist() == [2]
    # fairness raw: A 2/50 = 0.04, B 0.5/130 = 0.003846, C 2/100 = 0.02; max 0.04.
    expected_a = 1.0 * 0.8 + 0.5 * math.exp(-30 / 51) + 0.25 * 1.0
    expected_b = 1.0 * 0.2 + 0.5 * 1.0 + 0.25 * (0.5 / 130) / 0.04
    expected_c = 1.0 * 1.0 + 0.5 * math.exp(-20 / 51) + 0.25 * 0.5
    assert ranking.scores.tolist() == pytest.approx([expected_a, expected_b, expected_c])


def test_order_by_score_partial_selection_matches_full_stable_sort() -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 5, size=500).astype(float)  # many ties
    full = np.argsort(-scores, kind="stable")
    for limit in (1, 7, 64, 499, 500):
        assert order_by_score(scores, limit)[:limit].tolist() == full[:limit].tolist()

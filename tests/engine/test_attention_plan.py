"""The split of a padded decode batch: the longest few on their own when that pays."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations_with_replacement

import pytest

from tokenpace.engine.attention_plan import peeled
from tokenpace.engine.latency_model import LatencyModel
from tokenpace.engine.profile import EngineProfile


def brute_force(contexts: list[int], width: int, max_peeled: int, call: float) -> float:
    longest_first = sorted(contexts, reverse=True)
    costs = [
        width * longest_first[k] + sum(longest_first[:k]) + k * call
        for k in range(min(max_peeled, len(contexts) - 1) + 1)
    ]
    return min(costs)


def test_one_long_request_is_attended_on_its_own() -> None:
    # Padded: 6 x 950 = 5,700 tokens. Peeling the four longest: 6 x 100 + their 2,200
    # tokens + 4 calls of 128 = 3,312 (two: 3,506; three: 3,456).
    count, attended = peeled([950, 800, 250, 200, 100, 50], 6, 4, 128)
    assert (count, attended) == (4, 6 * 100 + 2200 + 4 * 128)
    assert peeled([950, 800, 250, 200, 100, 50], 6, 2, 128) == (2, 6 * 250 + 1750 + 256)
    # Equal contexts: padding costs nothing, so no call is worth it.
    assert peeled([300] * 6, 6, 4, 128) == (0, 1800.0)
    assert peeled([950, 50], 2, 0, 128) == (0, 1900.0)  # peeling switched off
    assert peeled([], 0, 4, 128) == (0, 0.0)


@pytest.mark.parametrize("call", [0.0, 128.0, 1000.0])
def test_the_chosen_split_is_the_cheapest(call: float) -> None:
    for contexts in combinations_with_replacement((20, 100, 400, 900, 1500), 4):
        count, attended = peeled(sorted(contexts, reverse=True), 5, 3, call)
        assert attended == brute_force(list(contexts), 5, 3, call)
        assert 0 <= count <= 3


def test_the_latency_model_predicts_the_engines_split(paper_profile: EngineProfile) -> None:
    padded = replace(paper_profile, decode_attention_ms_per_kctx=4.0, decode_attention_padded=True)
    split = replace(padded, decode_attention_peeled=4, decode_attention_call_tokens=128.0)
    contexts = [950, 800, 250, 200, 100, 50]
    args = (6, sum(contexts), max(contexts))
    assert LatencyModel(padded).decode_attention_ms(*args, contexts) == pytest.approx(4.0 * 5.7)
    expected = 4.0 * (6 * 100 + 2200 + 4 * 128) / 1000
    assert LatencyModel(split).decode_attention_ms(*args, contexts) == pytest.approx(expected)
    # Without the contexts it can only assume the padded batch.
    assert LatencyModel(split).decode_attention_ms(*args) == pytest.approx(4.0 * 5.7)

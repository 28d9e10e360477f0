"""The compiled size-order scan: used only where its exp is numpy's, and then the same
order as numpy's scan on a queue of 10,000."""

from __future__ import annotations

import numpy as np
import pytest

from tests.policy.twp.test_ranking_equivalence import random_queue
from tokenpace.policy.twp import ranking
from tokenpace.policy.twp.config import TwpConfig

kernel = pytest.importorskip("tokenpace.policy.twp.ranking_kernel")


def test_the_head_is_used_only_where_its_exp_is_numpys(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kernel.exp_matches_numpy() is kernel.EXP_MATCHES_NUMPY
    expected = kernel.ranked_head if kernel.EXP_MATCHES_NUMPY else None
    assert ranking.compiled_head() is expected
    monkeypatch.setattr(kernel, "EXP_MATCHES_NUMPY", False)
    assert ranking.compiled_head() is None


@pytest.mark.skipif(not kernel.EXP_MATCHES_NUMPY, reason="numpy's exp is not the C library's")
@pytest.mark.parametrize("learned", [False, True])
def test_a_queue_of_ten_thousand_ranks_as_numpy_does(learned: bool) -> None:
    rng = np.random.default_rng(3)
    queue = random_queue(10_000, rng, 40)
    # Removed entries that the size orders still hold (they drop them only when many).
    queue.remove(range(0, 10_000, 97))
    cfg = TwpConfig()
    expected = rng.uniform(1.0, 200.0, len(queue)) if learned else None
    excluded = np.array([5, 17, 4000], dtype=np.intp)
    for mean in (5.5, 35.0, 125.0):
        numpy_order = ranking.ranked(queue, 20.0, 50, mean, cfg, excluded, expected)
        compiled = ranking.ranked(
            queue, 20.0, 50, mean, cfg, excluded, expected, kernel.ranked_head
        )
        want = [next(numpy_order).request_id for _ in range(200)]
        assert [next(compiled).request_id for _ in range(200)] == want

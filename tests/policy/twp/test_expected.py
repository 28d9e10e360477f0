"""ExpectedOutput's queue figures: the shortcut to max_tokens before a curve is fitted gives
the very scores the estimator's own totals give."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import request, running
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import FinishReason, RequestStatus
from tokenpace.policy.output_length import OutputLengthConfig
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.expected import ExpectedOutput
from tokenpace.policy.twp.ranking import rank


def _queue(rows: list[tuple[int, int, int, int]]) -> WaitingQueue:
    queue = WaitingQueue()
    for i, (prompt, cap, streamed, step) in enumerate(rows):
        r = request(i, prompt, cap, arrival_s=0.01 * i, enqueued_step=step)
        r.token_times_s = [0.0] * min(streamed, cap - 1)
        queue.append(r)
    return queue


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 600), st.integers(1, 300), st.integers(0, 50), st.integers(0, 9)),
        min_size=1,
        max_size=30,
    ),
    st.floats(0.0, 400.0),
)
def test_unfitted_totals_shortcut_scores_as_the_estimator_totals(
    rows: list[tuple[int, int, int, int]], mean_remaining: float
) -> None:
    queue = _queue(rows)
    expected = ExpectedOutput(OutputLengthConfig(), enabled=True)
    assert not expected.estimator.fitted
    assert expected.queue_totals(queue) is None
    caps = queue.max_tokens
    produced = caps - queue.remaining_output_tokens
    totals = produced + expected.estimator.remaining(queue.num_prompt_tokens, produced, caps)
    cfg = TwpConfig()
    shortcut = rank(queue, 5.0, 10, mean_remaining, cfg, None).scores
    estimated = rank(queue, 5.0, 10, mean_remaining, cfg, totals).scores
    assert shortcut.tobytes() == estimated.tobytes()


def test_fitted_estimator_gives_its_own_totals() -> None:
    expected = ExpectedOutput(OutputLengthConfig(), enabled=True)
    batch = [running(i, 100, 200, 1) for i in range(4)]
    expected.observe(batch, 0)
    for r in batch:
        r.token_times_s = [0.0] * 20
        r.status = RequestStatus.FINISHED
        r.finish_reason = FinishReason.STOP
    expected.observe([], 1)
    assert expected.estimator.fitted
    totals = expected.queue_totals(_queue([(100, 200, 0, 0)]))
    assert totals is not None and np.all(totals < 200)

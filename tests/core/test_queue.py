"""WaitingQueue keeps its columns in queue order through appends, preemptions and removals."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import request
from tokenpace.core.queue import WaitingQueue


def test_columns_follow_queue_order_through_every_mutation() -> None:
    queue = WaitingQueue()
    for i in range(100):  # past the initial capacity: the columns grow
        queue.append(request(i, prompt=10 + i, max_tokens=20 + i, enqueued_step=i))
    preempted = request(500, prompt=7, max_tokens=50, enqueued_step=99)
    preempted.token_times_s = [0.0] * 30  # 30 tokens already streamed: 20 left
    queue.appendleft(preempted)
    removed = queue.remove([3, 500, 42])
    assert [r.request_id for r in removed] == [3, 500, 42]
    expected = [i for i in range(100) if i not in (3, 42)]
    assert queue.request_ids.tolist() == expected
    assert queue.num_prompt_tokens.tolist() == [10 + i for i in expected]
    assert queue.remaining_output_tokens.tolist() == [20 + i for i in expected]
    queue.appendleft(preempted)
    assert queue.remaining_output_tokens[0] == 20
    assert queue.max_tokens[0] == 50
    assert queue[0] is preempted


def test_removing_an_id_that_is_not_waiting_names_it() -> None:
    queue = WaitingQueue()
    queue.append(request(1))
    with pytest.raises(KeyError, match="request 9 is not waiting"):
        queue.remove([1, 9])


def test_iter_at_reads_positions_lazily_in_order() -> None:
    queue = WaitingQueue()
    for i in range(200):
        queue.append(request(i, prompt=10 + i))
    positions = np.array([150, 3, 77, 199, 0], dtype=np.intp)
    assert [r.request_id for r in queue.iter_at(positions)] == [150, 3, 77, 199, 0]
    assert [r.request_id for r in queue.iter_at([5, 6])] == [5, 6]
    assert list(queue.iter_at(np.zeros(0, dtype=np.intp))) == []
    # Across slices, last position first.
    every = np.arange(200, dtype=np.intp)[::-1]
    assert [r.request_id for r in queue.iter_at(every)] == list(range(199, -1, -1))

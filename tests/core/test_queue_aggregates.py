"""WaitingQueue's aggregates, kept up to date on every mutation, equal a recomputation."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import request
from tokenpace.core.key_order import OrderView
from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request

# One mutation: ("append" | "appendleft", prompt, max_tokens, streamed, arrival, step) or
# ("remove", picks) where picks index into the queue.
_ENTER = st.tuples(
    st.sampled_from(["append", "appendleft"]),
    st.integers(1, 40),
    st.integers(1, 40),
    st.integers(0, 39),
    st.integers(0, 30),
    st.integers(0, 20),
)
_LEAVE = st.tuples(st.just("remove"), st.lists(st.integers(0, 200), max_size=6))


def _check_order(view: OrderView, keys: list[int]) -> None:
    """The sorted entries are the live positions before the tail, in (key, position) order;
    each sorted entry's key bounds the keys after it (removed entries included)."""
    n = len(keys)
    assert 0 <= view.tail_start <= n and n - view.tail_start <= 64
    got = view.positions(0, len(view)).tolist()
    assert got == sorted(range(view.tail_start), key=lambda i: (keys[i], i))
    assert view.keys.tolist() == sorted(view.keys.tolist())
    # Reading in slices gives the same positions.
    sliced = [p for s in range(0, len(view), 5) for p in view.positions(s, s + 5).tolist()]
    assert sliced == got


def _check(queue: WaitingQueue) -> None:
    if not len(queue):
        assert queue.num_resumed == 0 and queue.arrival_sorted
        return
    arrivals = queue.arrival_s.tolist()
    assert queue.min_enqueued_step == int(queue.enqueued_step.min())
    assert queue.min_prompt_tokens == int(queue.num_prompt_tokens.min())
    assert queue.min_max_tokens == int(queue.max_tokens.min())
    assert queue.min_remaining_output_tokens == int(queue.remaining_output_tokens.min())
    assert queue.min_budget_tokens == int((queue.num_prompt_tokens + queue.max_tokens).min())
    assert queue.min_arrival_s == float(queue.arrival_s.min())
    assert queue.max_max_tokens == int(queue.max_tokens.max())
    _check_order(queue.prompt_order(), queue.num_prompt_tokens.tolist())
    budgets = queue.budget_tokens.tolist()
    assert budgets == (queue.num_prompt_tokens + queue.max_tokens).tolist()
    _check_order(queue.budget_order(), budgets)
    resumed = int((queue.remaining_output_tokens < queue.max_tokens).sum())
    assert queue.num_resumed == resumed
    in_order = all(a <= b for a, b in itertools.pairwise(arrivals))
    # False may lag (only re-checked when requests leave); True is always right.
    assert in_order or not queue.arrival_sorted


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_ENTER, _ENTER, _ENTER, _LEAVE), max_size=160))
def test_aggregates_equal_a_recomputation_after_any_mutations(
    mutations: list[tuple[object, ...]],
) -> None:
    queue = WaitingQueue()
    next_id = 0
    for mutation in mutations:
        if mutation[0] == "remove":
            picks = mutation[1]
            assert isinstance(picks, list)
            ids = queue.request_ids.tolist()
            chosen = list(dict.fromkeys(ids[p % len(ids)] for p in picks)) if ids else []
            queue.remove(chosen)
            if chosen and not queue.arrival_sorted:
                arrivals = queue.arrival_s.tolist()
                assert any(a > b for a, b in itertools.pairwise(arrivals))
        else:
            kind, prompt, cap, streamed, arrival, step = mutation
            assert isinstance(prompt, int) and isinstance(cap, int)
            assert isinstance(streamed, int) and isinstance(arrival, int)
            assert isinstance(step, int)
            r: Request = request(next_id, prompt, cap, float(arrival), step)
            r.token_times_s = [0.0] * min(streamed, cap - 1)
            next_id += 1
            (queue.append if kind == "append" else queue.appendleft)(r)
        _check(queue)


def test_minima_follow_the_requests_that_hold_them() -> None:
    queue = WaitingQueue()
    queue.append(request(0, prompt=50, max_tokens=10, arrival_s=1.0, enqueued_step=3))
    queue.append(request(1, prompt=5, max_tokens=90, arrival_s=0.5, enqueued_step=7))
    assert (queue.min_prompt_tokens, queue.min_max_tokens, queue.min_enqueued_step) == (5, 10, 3)
    assert queue.min_budget_tokens == 60 and not queue.arrival_sorted
    queue.remove([1])
    assert (queue.min_prompt_tokens, queue.min_budget_tokens) == (50, 60)
    assert queue.arrival_sorted


def test_prompt_order_sorts_appends_in_once_the_tail_is_long() -> None:
    queue = WaitingQueue()
    prompts = [(7 * i) % 23 + 1 for i in range(300)]
    for i, prompt in enumerate(prompts):
        queue.append(request(i, prompt=prompt))
    view = queue.prompt_order()
    assert view.tail_start > 200
    assert view.positions(0, len(view)).tolist() == sorted(
        range(view.tail_start), key=lambda i: (prompts[i], i)
    )
    queue.remove(list(range(0, 300, 3)))
    queue.appendleft(request(999, prompt=5))
    _check(queue)


def test_removed_entries_are_dropped_when_many_and_never_read() -> None:
    queue = WaitingQueue()
    for i in range(300):
        queue.append(request(i, prompt=(11 * i) % 37 + 1))
    queue.remove(list(range(0, 300, 2)) + list(range(1, 200, 2)))
    _check(queue)
    for i in range(300, 400):  # merges, and drops the removed entries on the way
        queue.append(request(i, prompt=(5 * i) % 13 + 1))
    assert len(queue.prompt_order()) < 300
    _check(queue)

"""The gate closes at the first failing candidate; force-admit; chunk sizes."""

from __future__ import annotations

from tests.helpers import request, running, state
from tokenpace.policy.twp.config import TwpConfig
from tokenpace.policy.twp.gate import GateOutcome, run_gate
from tokenpace.policy.twp.kv_guard import KvHeadroomGuard
from tokenpace.policy.twp.policy import TwpPolicy


def test_gate_closes_at_first_failure_without_skipping() -> None:
    guard = KvHeadroomGuard(TwpConfig())
    guard.update(0, 10_000)  # threshold 200 blocks
    a = request(0, max_tokens=50)
    b = request(1, max_tokens=20)
    c = request(2, max_tokens=5)
    # K = 40, H = 100: A -> 90 fits; B -> 110 fails and closes; C (would fit) waits.
    outcome = run_gate([a, b, c], GateOutcome(token_load=40.0, num_free_blocks=10_000), 100.0,
                       guard, block_size=16)  # fmt: skip
    assert [r.request_id for r in outcome.admitted] == [0]
    assert outcome.closed_by is b
    assert outcome.token_load == 90.0


def test_gate_closes_on_kv_guard() -> None:
    guard = KvHeadroomGuard(TwpConfig())
    guard.update(0, 1000)  # threshold 20 blocks
    a = request(0, prompt=32, max_tokens=16)  # footprint 3 blocks
    outcome = run_gate([a], GateOutcome(token_load=10.0, num_free_blocks=22), 1000.0, guard, 16)
    assert outcome.admitted == [] and outcome.closed_by is a  # 22 - 3 = 19 <= 20


def test_idle_server_admits_head_even_if_longer_than_window() -> None:
    guard = KvHeadroomGuard(TwpConfig())
    guard.update(0, 10_000)
    big = request(0, max_tokens=500)
    outcome = run_gate([big, request(1, max_tokens=10)], GateOutcome(num_free_blocks=10_000),
                       200.0, guard, 16)  # fmt: skip
    assert [r.request_id for r in outcome.admitted] == [0]


def test_force_admit_at_t_max_bypasses_a_full_window() -> None:
    policy = TwpPolicy(TwpConfig(t_max_steps=5))
    busy = [running(100 + i, prompt=10, max_tokens=200, produced=1) for i in range(5)]  # K=995
    starving = request(0, max_tokens=50, enqueued_step=0)
    fresh = request(1, max_tokens=50, enqueued_step=4)
    plan = policy.plan(state([starving, fresh], busy, step_index=4, latency_s=0.043))
    assert plan.admit_ids == ()  # 4 steps waited < T_max; window (~400) is full
    plan = policy.plan(state([starving, fresh], busy, step_index=5, latency_s=0.043))
    assert plan.admit_ids == (0,)
    assert plan.forced_ids == frozenset({0})


def test_chunked_prefill_feeds_c_tokens_per_request_per_step() -> None:
    policy = TwpPolicy(TwpConfig(chunk_tokens=64))
    new = request(0, prompt=150, max_tokens=20)
    plan = policy.plan(state([new]))
    assert plan.admit_ids == (0,)
    assert plan.num_scheduled_tokens == {0: 64}
    new.num_computed_tokens = 128  # after two chunks: 22 remain
    decoding = running(1, prompt=10, max_tokens=20, produced=3)
    plan = policy.plan(state([], [new, decoding]))
    assert plan.num_scheduled_tokens == {0: 22, 1: 1}


def test_telemetry_reports_controller_state() -> None:
    policy = TwpPolicy(TwpConfig())
    policy.plan(state([request(0)], latency_s=0.086))
    telemetry = policy.telemetry()
    assert telemetry["smoothed_itl_ms"] == 86.0
    assert telemetry["slowdown"] == 2.0
    # q = 1 -> 1 + 1/16; H* = 400 * 1.0625 / 2 = 212.5; H = 400 - 0.15 * 187.5 = 371.875.
    assert telemetry["token_window"] == 371.875

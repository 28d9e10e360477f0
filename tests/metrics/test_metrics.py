from __future__ import annotations

import math

import numpy as np
import pytest

from tokenpace.core.request import Request, RequestStatus
from tokenpace.metrics.aggregate import mean_ci, metric_rows, summarize
from tokenpace.metrics.request_metrics import latencies
from tokenpace.metrics.run_metrics import RunKey, distribution, summarize_run
from tokenpace.metrics.slo import Slo


def finished(request_id: int, arrival: float, times: list[float]) -> Request:
    r = Request(request_id, 10, len(times), arrival)
    r.token_times_s = times
    r.status = RequestStatus.FINISHED
    r.finished_s = times[-1]
    return r


def test_vllm_bench_definitions_by_hand() -> None:
    a = finished(0, 0.0, [0.5, 0.6, 0.8])  # TTFT 500, ITL 100 200, E2E 800, TPOT 150
    b = finished(1, 1.0, [1.1, 1.4])  # TTFT 100, ITL 300, E2E 400, TPOT 300
    lat = latencies([a, b], Slo(ttft_ms=400, tpot_ms=200))
    assert lat.ttft_ms.tolist() == pytest.approx([500, 100])
    assert sorted(lat.itl_ms.tolist()) == pytest.approx([100, 200, 300])
    assert lat.tpot_ms.tolist() == pytest.approx([150, 300])
    assert lat.meets_slo.tolist() == [False, False]  # a misses TTFT, b misses TPOT
    run = summarize_run(RunKey("x", "w", "sim", 0), [a, b], start_s=0.0, slo=Slo(600, 200))
    assert run["duration_s"] == pytest.approx(1.4)
    assert run["throughput_rps"] == pytest.approx(2 / 1.4)
    assert run["throughput_tok_s"] == pytest.approx(5 / 1.4)
    assert run["goodput_rps"] == pytest.approx(1 / 1.4)
    assert run["itl_ms"]["cv"] == pytest.approx(np.std([100, 200, 300]) / 200)


def test_unfinished_requests_do_not_count() -> None:
    pending = Request(5, 10, 4, 0.0)
    pending.token_times_s = [0.2]
    run = summarize_run(RunKey("x", "w", "sim", 0), [finished(0, 0, [0.1]), pending], 0.0, Slo())
    assert run["n_requests"] == 2 and run["n_completed"] == 1


def test_distribution_of_nothing_is_nan() -> None:
    assert math.isnan(distribution(np.zeros(0))["p99"])


def test_mean_ci_uses_student_t() -> None:
    stat = mean_ci([1.0, 2.0, 3.0])
    # sd 1, n 3, t(2) = 4.303 -> 4.303 / sqrt(3)
    assert stat["mean"] == 2.0 and stat["ci95"] == pytest.approx(4.303 / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])["ci95"])


def test_summarize_groups_by_scheduler_and_workload() -> None:
    base = summarize_run(RunKey("a", "w", "sim", 0), [finished(0, 0, [0.1, 0.2])], 0.0, Slo())
    other = dict(base, seed=1, throughput_rps=base["throughput_rps"] * 3)
    (entry,) = summarize([base, other])
    assert entry["n_seeds"] == 2
    assert entry["throughput_rps"]["mean"] == pytest.approx(base["throughput_rps"] * 2)


def test_metric_rows_read_means_and_intervals_by_path() -> None:
    entry = {
        "goodput_rps": {"mean": 2.0, "ci95": 0.5},
        "itl_ms": {"p99": {"mean": 90.0, "ci95": 3.0}},
    }
    rows = metric_rows(entry, (("goodput", ("goodput_rps",)), ("itl_p99", ("itl_ms", "p99"))))
    assert rows == {"goodput": {"mean": 2.0, "ci95": 0.5}, "itl_p99": {"mean": 90.0, "ci95": 3.0}}
    missing = metric_rows(entry, (("cold", ("num_cold_starts",)),))["cold"]
    assert math.isnan(missing["mean"]) and math.isnan(missing["ci95"])


def test_slo_misses_say_which_objective_each_request_missed() -> None:
    on_time = finished(0, 0.0, [0.1, 0.2, 0.3])
    late = finished(1, 0.0, [0.9, 1.0])  # TTFT 900 ms
    cold = finished(2, 0.0, [0.8, 0.9])  # TTFT 800 ms, after a cold start
    cold.cold_start_s = 0.5
    slow = finished(3, 0.0, [0.1, 0.5])  # TPOT 400 ms
    both = finished(4, 0.0, [0.7, 1.5])  # TTFT 700 ms and TPOT 800 ms
    pending = Request(5, 10, 4, 0.0)
    pending.token_times_s = [0.2]
    requests = [on_time, late, cold, slow, both, pending]
    run = summarize_run(RunKey("x", "w", "sim", 0), requests, 0.0, Slo(500, 200))
    assert run["ttft_miss_share"] == pytest.approx(3 / 6)
    assert run["cold_start_ttft_miss_share"] == pytest.approx(1 / 6)
    assert run["tpot_miss_share"] == pytest.approx(2 / 6)
    assert run["unserved_share"] == pytest.approx(1 / 6)
    assert run["slo_attainment"] == pytest.approx(1 / 6)
    # Without objectives nothing is missed; the unfinished request is still unserved.
    free = summarize_run(RunKey("x", "w", "sim", 0), requests, 0.0, Slo(None, None))
    assert free["ttft_miss_share"] == free["tpot_miss_share"] == 0.0
    assert free["unserved_share"] == pytest.approx(1 / 6)


def test_slo_miss_shares_are_averaged_over_seeds() -> None:
    runs = [
        summarize_run(RunKey("a", "w", "sim", seed), [finished(0, 0.0, [t, t + 0.1])], 0.0,
                      Slo(500, 200))
        for seed, t in enumerate((0.1, 0.9))
    ]  # fmt: skip
    (entry,) = summarize(runs)
    assert entry["ttft_miss_share"]["mean"] == pytest.approx(0.5)

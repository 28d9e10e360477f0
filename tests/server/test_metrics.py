"""/metrics exposes vLLM-style names under tokenpace:, TWP state and pool state."""

from __future__ import annotations

import httpx

from tests.server.conftest import RunningServer
from tests.server.helpers import MODEL, metric

NAMES = [
    "tokenpace:time_to_first_token_seconds_count",
    "tokenpace:inter_token_latency_seconds_count",
    "tokenpace:e2e_request_latency_seconds_count",
    "tokenpace:request_queue_time_seconds_count",
    "tokenpace:num_requests_running",
    "tokenpace:num_requests_waiting",
    "tokenpace:kv_cache_usage_perc",
    "tokenpace:twp_token_window",
    "tokenpace:twp_smoothed_itl_ms",
    "tokenpace:twp_slowdown",
    "tokenpace:twp_kv_threshold_blocks",
    "tokenpace:request_aborts_total",
    "tokenpace:requests_rejected_early_total",
    "tokenpace:num_containers",
    "tokenpace:cold_starts_total",
    "tokenpace:resumes_total",
    "tokenpace:migrations_total",
]


def test_metrics_after_a_request(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "temperature": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    for name in NAMES:
        assert f"\n{name}" in text, name
    assert metric(server.url, "tokenpace:time_to_first_token_seconds_count") >= 1
    assert metric(server.url, "tokenpace:inter_token_latency_seconds_count") >= 1
    assert metric(server.url, "tokenpace:twp_token_window") > 0
    assert metric(server.url, "tokenpace:num_containers", 'state="warm"') == 1


def test_metrics_export_the_live_profile(server: RunningServer) -> None:
    """Online calibration is on by default: the engine's refitted profile is exported."""
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 16, "temperature": 0}
    body["ignore_eos"] = True
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    assert metric(server.url, "tokenpace:profile_steps", 'container="0"') >= 16
    assert metric(server.url, "tokenpace:profile_b0", 'container="0"') == 8
    l_min = metric(server.url, "tokenpace:profile_l_min_ms", 'container="0"')
    smoothed_itl = metric(server.url, "tokenpace:twp_smoothed_itl_ms", 'container="0"')
    # The live l_min is this engine's, not a shipped profile's: near the ITL it serves at.
    assert 0.25 * smoothed_itl < l_min < 4 * smoothed_itl
    for name in ("alpha_ms", "prefill_ms_per_token", "speed_changes"):
        assert metric(server.url, f"tokenpace:profile_{name}", 'container="0"') >= 0


def test_dtype_auto_measured_both_precisions_at_a_batch(server: RunningServer) -> None:
    """--dtype auto timed each candidate at a batch of several requests (one request times
    the weight read alone, where float32 can win and then lose once requests batch)."""
    for dtype in ("float32", "bfloat16"):
        labels = f'container="0",dtype="{dtype}"'
        assert metric(server.url, "tokenpace:engine_dtype_step_seconds", labels) > 0
    text = httpx.get(f"{server.url}/metrics").text
    batches = {
        int(line.split('batch="')[1].split('"')[0])
        for line in text.splitlines()
        if line.startswith("tokenpace:engine_dtype_step_seconds{")
    }
    assert batches and min(batches) >= 8

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

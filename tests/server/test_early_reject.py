"""--early-reject: a request the scheduler predicts will miss its TTFT objective gets a 429
with an OpenAI-style body, counted apart from errors and from the queue's 429s."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server
from tests.server.helpers import MODEL, metric, wait_until_idle
from tokenpace.server.main import Server, check_names
from tokenpace.server.options import ServeOptions

pytestmark = pytest.mark.slow

REJECTED = "tokenpace:requests_rejected_early_total"


@pytest.fixture(scope="module")
def rejecting_server(native_profile: str) -> Iterator[RunningServer]:
    # A 1 ms objective: even a lone request's single prefill step (the ITL target, 95 ms)
    # misses it, so the policy predicts a miss for every request, on its own estimate.
    # A small KV cache keeps the engine's load short.
    running = start_server(
        scheduler="twp_slo",
        early_reject=True,
        slo_ttft_ms=1.0,
        kv_cache_tokens=4096,
        profile=native_profile,
    )
    yield running
    running.stop()


def test_a_request_predicted_to_miss_gets_429(rejecting_server: RunningServer) -> None:
    url = rejecting_server.url
    before = metric(url, REJECTED)
    failures = metric(url, "tokenpace:request_failures_total")
    queue_full = metric(url, "tokenpace:requests_rejected_total", 'reason="queue_full"')
    completion = {"model": MODEL, "prompt": "Hello there", "max_tokens": 4}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    answers = [
        httpx.post(f"{url}/v1/completions", json=completion, timeout=60),
        httpx.post(f"{url}/v1/completions", json={**completion, "stream": True}, timeout=60),
        httpx.post(f"{url}/v1/chat/completions", json={**chat, "stream": True}, timeout=60),
    ]
    for answer in answers:
        assert answer.status_code == 429, answer.text
        assert answer.headers["content-type"].startswith("application/json")
        assert answer.headers["retry-after"] == "1"
        error = answer.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["code"] == "predicted_slo_miss"
        assert "time to first token" in error["message"]
        assert "over the objective of 0.00 s" in error["message"]
    assert metric(url, REJECTED) == before + 3
    assert metric(url, "tokenpace:request_failures_total") == failures
    assert metric(url, "tokenpace:requests_rejected_total", 'reason="queue_full"') == queue_full
    assert metric(url, "tokenpace:generation_tokens_total") == 0  # nothing was computed
    # Nothing is left behind: the container and the admission queue are empty.
    (container,) = wait_until_idle(url)["containers"]
    assert container["num_waiting"] == container["num_running"] == 0
    built = rejecting_server.server
    assert isinstance(built, Server)
    assert built.service.admission.num_requests == 0


def test_early_reject_needs_a_scheduler_that_predicts_and_the_native_engine() -> None:
    with pytest.raises(ValueError, match="--early-reject needs --engine native"):
        ServeOptions(engine="vllm", scheduler="twp_slo", early_reject=True)
    with pytest.raises(ValueError, match=r"'fcfs' cannot predict .* twp_slo"):
        check_names(ServeOptions(scheduler="fcfs", early_reject=True))
    options = ServeOptions(scheduler="twp_slo", early_reject=True)
    assert options.policy_name == "twp_slo-early_reject" and options.rejects_early
    assert not ServeOptions(scheduler="twp_slo").rejects_early


def test_several_choices_predicted_to_miss_get_one_429_and_leave_nothing(
    rejecting_server: RunningServer,
) -> None:
    """A batch of prompts with two samples each: every choice is refused, the response is
    one 429 (streamed or not), and no choice is left running or queued."""
    url = rejecting_server.url
    before = metric(url, REJECTED)
    body = {"model": MODEL, "prompt": ["Hello there", "Good morning"], "n": 2, "max_tokens": 4}
    for stream in (False, True):
        answer = httpx.post(f"{url}/v1/completions", json={**body, "stream": stream}, timeout=60)
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "predicted_slo_miss"
    assert metric(url, REJECTED) >= before + 2
    (container,) = wait_until_idle(url)["containers"]
    assert container["num_waiting"] == container["num_running"] == 0
    built = rejecting_server.server
    assert isinstance(built, Server)
    assert built.service.admission.num_requests == 0

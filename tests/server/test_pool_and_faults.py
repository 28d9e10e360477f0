"""Pool mode (containers going cold and cold-starting) and engine failures."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server
from tests.server.helpers import MODEL, metric, sse_payloads

BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}


class FlakyEngine:
    """Delegates to a real engine; ``execute`` raises while ``failing[0]`` is True."""

    def __init__(self, engine: Any, failing: list[bool]) -> None:
        self._engine = engine
        self._failing = failing

    def execute(self, chunks: Sequence[Any]) -> Any:
        if self._failing[0]:
            self._failing[0] = False
            raise RuntimeError("simulated device fault")
        return self._engine.execute(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def flaky() -> list[bool]:
    return [False]


@pytest.fixture(scope="module")
def flaky_server(loaded_model: object, flaky: list[bool]) -> Iterator[RunningServer]:
    running = start_server(loaded_model, wrap=lambda engine: FlakyEngine(engine, flaky))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def pooled_server(loaded_model: object) -> Iterator[RunningServer]:
    running = start_server(loaded_model, containers=2, keep_alive_s=0.5)
    yield running
    running.stop()


def test_engine_failure_fails_requests_and_restarts(
    flaky_server: RunningServer, flaky: list[bool]
) -> None:
    url = f"{flaky_server.url}/v1/completions"
    flaky[0] = True
    failed = httpx.post(url, json=BODY, timeout=60)
    assert failed.status_code == 500
    assert "simulated device fault" in failed.json()["error"]["message"]
    assert httpx.post(url, json=BODY, timeout=60).status_code == 200
    flaky[0] = True
    streamed = httpx.post(url, json={**BODY, "stream": True}, timeout=60)
    payloads = sse_payloads(streamed.text)
    assert payloads[-1] == "[DONE]"
    assert any('"error"' in p for p in payloads)
    assert metric(flaky_server.url, "tokenpace:engine_restarts_total") == 2
    assert metric(flaky_server.url, "tokenpace:request_failures_total") == 2
    assert httpx.post(url, json=BODY, timeout=60).status_code == 200


def test_idle_containers_go_cold_and_cold_start_on_demand(pooled_server: RunningServer) -> None:
    url = pooled_server.url
    deadline = time.monotonic() + 30
    while metric(url, "tokenpace:num_containers", 'state="cold"') < 2:
        assert time.monotonic() < deadline, "containers did not go cold after keep-alive"
        time.sleep(0.1)
    before = metric(url, "tokenpace:cold_starts_total")
    response = httpx.post(f"{url}/v1/completions", json=BODY, timeout=120)
    assert response.status_code == 200
    assert metric(url, "tokenpace:cold_starts_total") == before + 1
    ttft = metric(url, "tokenpace:time_to_first_token_seconds_sum")
    assert ttft > 0

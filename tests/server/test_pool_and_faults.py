"""Pool mode and engine deaths, with real worker processes killed by a real signal."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server
from tests.server.helpers import (
    LONG,
    MODEL,
    busy_container,
    health,
    metric,
    stream_in_background,
    stream_text,
    wait_for,
)

pytestmark = pytest.mark.slow

BODY = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def pooled_server(native_profile: str) -> Iterator[RunningServer]:
    # Keep-alive long enough that the container loaded first is still warm when the other
    # is: with 3 s, two loads more than 3 s apart (a busy machine, each engine's probes at
    # load) never showed both warm at once.
    running = start_server(
        containers=2, warm_containers=2, keep_alive_s=20.0, profile=native_profile
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def solo_server(native_profile: str) -> Iterator[RunningServer]:
    running = start_server(profile=native_profile)
    yield running
    running.stop()


def test_killed_engine_requests_resume_on_another_container(
    pooled_server: RunningServer,
) -> None:
    url = pooled_server.url
    # Both containers load the model at start; on a busy 2-core machine that can take over a
    # minute (test_migration's wait allows the same).
    wait_for(lambda: all(c["state"] == "warm" for c in health(url)["containers"]), "not warm", 300)
    # A sampled request with a seed: the same text whether or not its engine dies mid-way.
    body = {**LONG, "temperature": 1.0, "top_p": 0.9, "seed": 1234}
    whole = httpx.post(f"{url}/v1/completions", json=body, timeout=180).json()
    body["stream_options"] = {"include_usage": True}
    thread, payloads = stream_in_background(url, body)
    victim = busy_container(url)
    time.sleep(0.5)  # let some tokens reach the client first
    os.kill(victim["pid"], signal.SIGKILL)
    thread.join(180)
    assert payloads[-1] == "[DONE]"
    assert not any('"error"' in p for p in payloads)
    assert '"completion_tokens": 96' in payloads[-2]
    assert stream_text(payloads, chat=False) == whole["choices"][0]["text"]
    assert metric(url, "tokenpace:resumes_total") == 1
    assert metric(url, "tokenpace:migrations_total") == 0, "a resume is not a migration"
    assert metric(url, "tokenpace:engine_restarts_total") == 1
    # The dead container comes back with a new engine process (which may go cold again
    # after keep-alive before this looks, so its new load time is what is checked).
    wait_for(
        lambda: health(url)["containers"][victim["id"]]["last_load_s"] != victim["last_load_s"],
        "the container was not restarted",
    )


def test_idle_containers_go_cold_and_cold_start_on_demand(pooled_server: RunningServer) -> None:
    url = pooled_server.url
    wait_for(
        lambda: metric(url, "tokenpace:num_containers", 'state="cold"') == 2,
        "containers did not go cold after keep-alive",
        300,
    )
    assert all(c["pid"] is None for c in health(url)["containers"])
    before = metric(url, "tokenpace:cold_starts_total")
    response = httpx.post(f"{url}/v1/completions", json=BODY, timeout=120)
    assert response.status_code == 200
    assert metric(url, "tokenpace:cold_starts_total") == before + 1
    assert metric(url, "tokenpace:time_to_first_token_seconds_sum") > 0


def test_killed_engine_fails_its_requests_clearly_and_restarts(
    solo_server: RunningServer,
) -> None:
    url = solo_server.url
    thread, payloads = stream_in_background(url, LONG)
    victim = busy_container(url)
    os.kill(victim["pid"], signal.SIGKILL)
    thread.join(180)
    assert payloads[-1] == "[DONE]"
    assert any("killed by SIGKILL" in p for p in payloads)

    def kill_when_running() -> None:
        os.kill(busy_container(url)["pid"], signal.SIGKILL)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    failed = httpx.post(f"{url}/v1/completions", json=LONG, timeout=180)
    killer.join()
    assert failed.status_code == 500
    assert "killed by SIGKILL" in failed.json()["error"]["message"]
    assert metric(url, "tokenpace:engine_restarts_total") == 2
    assert metric(url, "tokenpace:request_failures_total") == 2
    # The server stayed up; the restarted engine serves the next request.
    assert httpx.post(f"{url}/v1/completions", json=BODY, timeout=120).status_code == 200

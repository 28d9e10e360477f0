"""A Ray node cut off while it streams: its processes are frozen (SIGSTOP), so the server's
TCP connection to the engine actor stays open and no EOF ever comes. Ray's health checks
declare the node dead; the server must then move the stream to the other node.

The cluster checks node health every second and declares a node dead after 5 missed checks
(a margin against a busy CPU delaying a healthy raylet), so the test does not wait Ray's
default 15 s or more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.conftest import RunningServer
from tests.server.helpers import (
    LONG,
    busy_container,
    health,
    metric,
    stream_in_background,
    wait_for,
)
from tests.server.ray_cluster import node_of, ray_cluster, start_ray_pool

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
STREAMED = {**LONG, "max_tokens": 64, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from ray_cluster(num_nodes=2, system_config=HEALTH_CHECKS)


@pytest.fixture(scope="module")
def ray_server(cluster: Any, native_profile: str) -> Iterator[RunningServer]:
    running = start_ray_pool(cluster, containers=2, warm_containers=2, profile=native_profile)
    yield running
    running.stop()


def test_a_frozen_node_is_declared_dead_and_its_stream_moves(
    ray_server: RunningServer, cluster: Any
) -> None:
    url = ray_server.url
    wait_for(
        lambda: all(c["state"] == "warm" for c in health(url)["containers"]),
        "the engine actors did not load",
        120,
    )
    thread, payloads = stream_in_background(url, STREAMED)
    victim = busy_container(url)
    node = node_of(cluster, victim)
    frozen = [victim["pid"], *(p.process.pid for p in node.all_processes["raylet"])]
    time.sleep(0.5)  # let some tokens reach the client first
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        thread.join(180)
        assert payloads[-1] == "[DONE]"
        assert not any('"error"' in p for p in payloads)
        assert '"completion_tokens": 64' in payloads[-2]
        assert metric(url, "tokenpace:resumes_total") == 1
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

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

from tests.server.conftest import RunningServer, start_server
from tests.server.helpers import (
    MODEL,
    busy_container,
    health,
    metric,
    stream_in_background,
    wait_for,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

NODE_CPUS = 2
OBJECT_STORE_BYTES = 80 * 2**20
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 5,
}
LONG = {
    "model": MODEL,
    "prompt": "Tell me a long story about a lighthouse.",
    "max_tokens": 64,
    "temperature": 0,
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    pytest.importorskip("ray", reason="needs the ray extra (scripts/setup.sh ray)")
    import ray
    from ray.cluster_utils import Cluster

    cluster: Any = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            "_system_config": HEALTH_CHECKS,
        },
    )
    for _ in range(2):
        cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE_BYTES)
    yield cluster
    ray.shutdown()  # type: ignore[no-untyped-call]
    cluster.shutdown()


@pytest.fixture(scope="module")
def ray_server(cluster: Any) -> Iterator[RunningServer]:
    running = start_server(
        containers=2,
        warm_containers=2,
        ray_address=cluster.address,
        ray_cpus_per_engine=float(NODE_CPUS),
    )
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
    thread, payloads = stream_in_background(url, LONG)
    victim = busy_container(url)
    node_prefix = victim["location"].split()[2]
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id.startswith(node_prefix)]
    frozen = [victim["pid"], *(p.process.pid for p in node.all_processes["raylet"])]
    time.sleep(0.5)  # let some tokens reach the client first
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        thread.join(180)
        assert payloads[-1] == "[DONE]"
        assert not any('"error"' in p for p in payloads)
        assert '"completion_tokens": 64' in payloads[-2]
        assert metric(url, "tokenpace:migrations_total") == 1
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

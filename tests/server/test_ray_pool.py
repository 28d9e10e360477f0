"""A pool placed on a real multi-node Ray cluster (``--ray-address``).

The cluster is Ray's own: a head node that runs no engines and two worker nodes of two
CPUs each, every node its own raylet (``ray.cluster_utils.Cluster``), on this machine. Each
engine actor reserves two CPUs, so the two containers must land on different nodes. A
node is then removed while it streams: its request moves to the other node, and the
container comes back once a new node joins.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, vllm_server_settings
from tests.server.helpers import (
    LONG,
    busy_container,
    health,
    metric,
    stream_in_background,
    stream_text,
    wait_for,
)
from tests.server.ray_cluster import add_node, node_of, ray_cluster, start_ray_pool

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STREAMED = {**LONG, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from ray_cluster(num_nodes=2)


@pytest.fixture(scope="module")
def ray_server(cluster: Any, native_profile: str) -> Iterator[RunningServer]:
    running = start_ray_pool(cluster, containers=2, warm_containers=2, profile=native_profile)
    yield running
    running.stop()


def warm_nodes(url: str) -> list[str]:
    """The locations of the warm containers."""
    return [c["location"] for c in health(url)["containers"] if c["state"] == "warm"]


def test_containers_are_placed_on_separate_nodes_and_serve(ray_server: RunningServer) -> None:
    url = ray_server.url
    wait_for(lambda: len(warm_nodes(url)) == 2, "the engine actors did not load", 120)
    locations = warm_nodes(url)
    assert all(location.startswith("ray node ") for location in locations)
    assert len(set(locations)) == 2
    body = {**LONG, "max_tokens": 8}
    for _ in range(4):
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 8


def test_a_lost_node_moves_its_stream_and_the_container_returns_on_a_new_node(
    ray_server: RunningServer, cluster: Any
) -> None:
    url = ray_server.url
    wait_for(lambda: len(warm_nodes(url)) == 2, "the engine actors did not load", 120)
    thread, payloads = stream_in_background(url, STREAMED)
    victim = busy_container(url)
    survivor = next(c for c in health(url)["containers"] if c["id"] != victim["id"])
    node = node_of(cluster, victim)
    time.sleep(0.5)  # let some tokens reach the client first
    cluster.remove_node(node, allow_graceful=False)
    thread.join(180)
    assert payloads[-1] == "[DONE]"
    assert not any('"error"' in p for p in payloads)
    assert '"completion_tokens": 96' in payloads[-2]
    assert stream_text(payloads, chat=False)
    assert metric(url, "tokenpace:resumes_total") == 1
    assert metric(url, "tokenpace:engine_restarts_total") == 1
    # No node has room for the restarted actor: it waits, loading, until one joins.
    assert health(url)["containers"][victim["id"]]["state"] == "loading"
    assert health(url)["containers"][survivor["id"]]["location"] == survivor["location"]
    add_node(cluster)
    wait_for(lambda: len(warm_nodes(url)) == 2, "the container did not come back", 120)
    back = health(url)["containers"][victim["id"]]["location"]
    assert back not in (victim["location"], survivor["location"])
    response = httpx.post(f"{url}/v1/completions", json={**LONG, "max_tokens": 4})
    assert response.status_code == 200


def test_vllm_engine_runs_as_an_actor_on_the_node_with_room(
    ray_server: RunningServer, cluster: Any, native_profile: str
) -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    taken = set(warm_nodes(ray_server.url))
    add_node(cluster)
    running = start_ray_pool(cluster, **vllm_server_settings(native_profile))
    try:
        (location,) = warm_nodes(running.url)
        assert location.startswith("ray node ") and location not in taken
        body = {**LONG, "max_tokens": 8}
        response = httpx.post(f"{running.url}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 8
        # TWP decides inside vLLM's scheduler on the remote node.
        assert metric(running.url, "tokenpace:twp_token_window") > 0
    finally:
        running.stop()

"""Real multi-node Ray clusters for the serve tests (``ray.cluster_utils.Cluster``: every
node its own raylet, all on this machine) and pools placed on them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.conftest import RunningServer, start_server

NODE_CPUS = 2  # what each engine actor reserves: one container per worker node
OBJECT_STORE_BYTES = 80 * 2**20


def ray_cluster(num_nodes: int, system_config: dict[str, int] | None = None) -> Iterator[Any]:
    """For a fixture: a head node that runs no engines and ``num_nodes`` worker nodes of
    ``NODE_CPUS`` CPUs; shut down (with this process's Ray link) afterwards."""
    pytest.importorskip("ray", reason="needs the ray extra (scripts/setup.sh ray)")
    import ray
    from ray.cluster_utils import Cluster

    head: dict[str, Any] = {
        "num_cpus": 0,
        "object_store_memory": OBJECT_STORE_BYTES,
        "include_dashboard": False,
    }
    if system_config is not None:
        head["_system_config"] = system_config
    cluster: Any = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(num_nodes):
        add_node(cluster)
    yield cluster
    ray.shutdown()  # type: ignore[no-untyped-call]
    cluster.shutdown()


def add_node(cluster: Any) -> Any:
    """A worker node with room for one engine actor."""
    return cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE_BYTES)


def start_ray_pool(cluster: Any, **overrides: object) -> RunningServer:
    """A server whose containers' engines are actors on ``cluster``."""
    settings: dict[str, Any] = {
        "ray_address": cluster.address,
        "ray_cpus_per_engine": float(NODE_CPUS),
    }
    settings.update(overrides)
    return start_server(**settings)


def node_of(cluster: Any, container: dict[str, Any]) -> Any:
    """The cluster node hosting a container, from its ``/health`` location."""
    node_prefix = container["location"].split()[2]
    (node,) = [n for n in cluster.list_all_nodes() if n.node_id.startswith(node_prefix)]
    return node

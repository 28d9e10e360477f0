from __future__ import annotations

import pytest

from tokenpace.core.lifecycle import ContainerState
from tokenpace.core.registry import UnknownNameError
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.checkpoint import load_time_s
from tokenpace.pool.router import ROUTERS, build_router
from tokenpace.pool.view import ContainerView

WARM, LOADING, COLD = ContainerState.WARM, ContainerState.LOADING, ContainerState.COLD
REQUEST = Request(request_id=0, num_prompt_tokens=100, max_tokens=50, arrival_s=0.0)


def view(
    cid: int,
    state: ContainerState,
    tokens: int = 0,
    requests: int = 0,
    startup_s: float = 0.0,
    wait_s: float = 0.0,
    tier: str = "gpu",
) -> ContainerView:
    return ContainerView(cid, state, 0, requests, tokens, startup_s, wait_s, tier)


def test_registry_lists_the_routers() -> None:
    assert ROUTERS.names() == ["headroom", "least_loaded", "round_robin", "serverlessllm"]
    with pytest.raises(UnknownNameError, match="least_loaded"):
        build_router("random")


def test_round_robin_rotates_whatever_the_state() -> None:
    router = build_router("round_robin")
    views = [view(0, WARM, 900), view(1, COLD), view(2, LOADING)]
    assert [router.route(REQUEST, views) for _ in range(5)] == [0, 1, 2, 0, 1]


def test_least_loaded_prefers_warm_then_fewest_tokens_then_requests() -> None:
    router = build_router("least_loaded")
    assert router.route(REQUEST, [view(0, WARM, 5000), view(1, COLD, 0)]) == 0
    assert router.route(REQUEST, [view(0, WARM, 500), view(1, WARM, 400)]) == 1
    assert router.route(REQUEST, [view(0, WARM, 400, 3), view(1, WARM, 400, 2)]) == 1
    assert router.route(REQUEST, [view(0, WARM, 400, 2), view(1, WARM, 400, 2)]) == 0
    assert router.route(REQUEST, [view(0, COLD), view(1, LOADING, 100)]) == 1
    assert router.route(REQUEST, [view(0, COLD), view(1, COLD)]) == 0


def test_serverlessllm_picks_min_startup_plus_queue(profile: EngineProfile) -> None:
    router = build_router("serverlessllm")
    host = load_time_s(profile, "host_memory")  # 2.54 s
    ssd = load_time_s(profile, "local_ssd")  # 4.14 s
    remote = load_time_s(profile, "remote")  # 8.43 s
    busy_warm = view(0, WARM, 3000, 20, wait_s=3.0)
    host_cold = view(1, COLD, startup_s=host, tier="host_memory")
    ssd_cold = view(2, COLD, startup_s=ssd, tier="local_ssd")
    remote_cold = view(3, COLD, startup_s=remote, tier="remote")
    # Locality: the server whose host memory holds the checkpoint starts fastest.
    assert router.route(REQUEST, [busy_warm, remote_cold, ssd_cold, host_cold]) == 1
    # A short queue on a warm container beats any cold start.
    light_warm = view(0, WARM, 300, 2, wait_s=1.0)
    assert router.route(REQUEST, [light_warm, host_cold, ssd_cold]) == 0
    # A loading container counts its remaining load plus its queue.
    loading = view(4, LOADING, 100, 1, startup_s=0.5, wait_s=0.2)
    assert router.route(REQUEST, [busy_warm, host_cold, loading]) == 4
    # Without the host-memory copy, SSD beats remote.
    assert router.route(REQUEST, [view(0, WARM, 9000, 60, wait_s=9.0), remote_cold, ssd_cold]) == 2


def test_only_serverlessllm_migrates() -> None:
    assert {n: build_router(n).migrates for n in ROUTERS.names()} == {
        "headroom": False,
        "least_loaded": False,
        "round_robin": False,
        "serverlessllm": True,
    }

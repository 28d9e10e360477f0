"""Clients that drop mid-stream: aborted within a step, KV freed, aborts counted."""

from __future__ import annotations

import asyncio

import httpx

from tests.server.conftest import RunningServer
from tests.server.helpers import MODEL, metric, wait_until_idle

NUM_CLIENTS = 20


def test_clients_dropping_mid_stream_free_their_kv(server: RunningServer) -> None:
    wait_until_idle(server.url)
    aborts_before = metric(server.url, "tokenpace:request_aborts_total")
    body = {
        "model": MODEL,
        "prompt": "Write a very long story about the sea.",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }

    async def drop_after_first_token(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"text": ""' not in line:
                    return  # closing the stream drops the connection

    async def run() -> float:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            await asyncio.gather(*(drop_after_first_token(client) for _ in range(NUM_CLIENTS)))
        return metric(server.url, "tokenpace:kv_cache_used_blocks")

    asyncio.run(run())
    health = wait_until_idle(server.url, timeout_s=60)
    container = health["containers"][0]
    assert container["num_used_blocks"] == 0
    assert container["num_running"] == 0 and container["num_waiting"] == 0
    assert metric(server.url, "tokenpace:kv_cache_usage_perc") == 0.0
    assert metric(server.url, "tokenpace:request_aborts_total") - aborts_before == NUM_CLIENTS

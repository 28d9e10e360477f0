"""A uvicorn server that starts draining the engines as soon as shutdown begins."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from tokenpace.server.app import drain
from tokenpace.server.service import Service


class DrainingServer(uvicorn.Server):
    """uvicorn waits for open connections before the app's lifespan shutdown runs; a
    stream that outlives the deadline would then be cut mid-response. This server starts
    ``drain`` when shutdown begins, so requests still running at the deadline are aborted
    and their streams end with ``[DONE]`` before uvicorn gives up on them."""

    def __init__(self, config: uvicorn.Config, service: Service, timeout_s: float) -> None:
        super().__init__(config)
        self._service = service
        self._timeout_s = timeout_s
        self._drain_task: asyncio.Task[None] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._service.accepting = False
        self._drain_task = asyncio.create_task(drain(self._service, self._timeout_s))
        await super().shutdown(sockets)
        await self._drain_task

    def bound_port(self) -> int:
        """The TCP port actually bound (useful with port 0), once started."""
        first: Any = self.servers[0].sockets[0]
        return int(first.getsockname()[1])

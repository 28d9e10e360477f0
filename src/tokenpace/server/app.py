"""The FastAPI application: OpenAI routes, health, metrics, errors and graceful shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse

from tokenpace.server.body_limit import BodyLimit
from tokenpace.server.errors import install_error_handlers
from tokenpace.server.metrics import CONTENT_TYPE
from tokenpace.server.routes import RouteConfig, attach
from tokenpace.server.service import Service

logger = logging.getLogger("tokenpace.server")

_DRAIN_POLL_S = 0.05
# Seconds aborted streams get to send their last chunk before the engines stop.
ABORT_GRACE_S = 2.0


def build_app(service: Service, config: RouteConfig, shutdown_timeout_s: float) -> FastAPI:
    """The app over ``service`` (bodies over ``config.max_request_bytes`` get a 413). On
    shutdown it stops accepting (503), lets in-flight work
    finish for up to ``shutdown_timeout_s`` seconds, then aborts the rest and stops the
    engine threads."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await drain(service, shutdown_timeout_s)

    app = FastAPI(title="tokenpace", version="0.1.0", lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    attach(app, service, config)

    @app.get("/health")
    async def health() -> JSONResponse:
        snapshots = service.pool.snapshots()
        body: dict[str, Any] = {
            "status": "ok" if service.accepting else "shutting_down",
            "containers": [
                {
                    "id": s.container_id,
                    "state": s.state.value,
                    "phase": s.phase.value,
                    "num_running": s.num_running,
                    "num_waiting": s.num_waiting,
                    "num_used_blocks": s.num_used_blocks,
                    "pid": s.pid,
                    "location": s.location,
                    "last_load_s": s.last_load_s,
                }
                for s in snapshots
            ],
        }
        return JSONResponse(body, status_code=200 if service.accepting else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    return app


async def drain(service: Service, timeout_s: float) -> None:
    """Stop accepting, wait up to ``timeout_s`` seconds for the pool to go idle, then abort
    what is left (its streams end with finish_reason "abort" and ``[DONE]``) and stop
    every container. Safe to call more than once."""
    service.accepting = False
    loop = asyncio.get_running_loop()
    if not await _wait_idle(service, loop.time() + timeout_s):
        logger.warning("shutdown deadline passed: aborting in-flight requests")
        service.pool.abort_all()
        await _wait_idle(service, loop.time() + ABORT_GRACE_S)
    await asyncio.to_thread(service.pool.stop, timeout_s)


async def _wait_idle(service: Service, deadline: float) -> bool:
    loop = asyncio.get_running_loop()
    while not service.pool.is_idle():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_DRAIN_POLL_S)
    return True

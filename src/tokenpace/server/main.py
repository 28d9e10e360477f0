"""Assemble and run ``tokenpace serve``: engine factory, pool, service, app, uvicorn."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi import FastAPI

from tokenpace.core.registry import UnknownNameError
from tokenpace.engine.base import Engine
from tokenpace.policy import POLICIES, build_policy
from tokenpace.pool.router import ROUTERS, build_router
from tokenpace.server.admission import AdmissionQueue, QueueBounds
from tokenpace.server.app import ABORT_GRACE_S, build_app
from tokenpace.server.container import ContainerDeps
from tokenpace.server.metrics import ServerMetrics
from tokenpace.server.options import ServeOptions
from tokenpace.server.pool import ServerPool
from tokenpace.server.profile import calibrate_profile
from tokenpace.server.routes import RouteConfig
from tokenpace.server.service import ModelLimits, Service
from tokenpace.server.uvicorn_server import DrainingServer

logger = logging.getLogger("tokenpace.server")


class ServedEngine(Engine, Protocol):
    """An engine that also carries the tokenizer of its model."""

    @property
    def tokenizer(self) -> Any: ...


EngineFactory = Callable[[], ServedEngine]


@dataclass(frozen=True, slots=True)
class Server:
    """A built server: ``app`` is ready for uvicorn, the pool threads are running."""

    app: FastAPI
    service: Service
    pool: ServerPool
    metrics: ServerMetrics
    options: ServeOptions


def native_engine_factory(options: ServeOptions) -> EngineFactory:
    """Each call loads the model from its cached safetensors tier (a real cold start)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # Spinning OpenMP workers starve the event loop and the other containers' threads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from tokenpace.engine.native import NativeEngine, NativeEngineConfig

    config = NativeEngineConfig(
        model=options.model,
        cache_dir=options.cache_dir,
        dtype=options.dtype,
        device=options.device,
        num_threads=options.num_threads,
        kv_cache_tokens=options.kv_cache_tokens,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
    )

    def load() -> ServedEngine:
        return NativeEngine.load(config, clock=time.perf_counter)

    return load


def check_names(options: ServeOptions) -> None:
    """Raise ValueError naming the flag when the scheduler or router is unknown."""
    for flag, registry, name in (
        ("--scheduler", POLICIES, options.scheduler),
        ("--router", ROUTERS, options.router),
    ):
        try:
            registry.get(name)
        except UnknownNameError as error:
            raise ValueError(f"{flag}: {error}") from None


def build_server(
    options: ServeOptions,
    engine_factory: EngineFactory | None = None,
    clock: Callable[[], float] = time.perf_counter,
    unix_clock: Callable[[], float] = time.time,
) -> Server:
    """Load the first engine (container 0 starts warm on it), start the pool threads and
    build the app. Other containers start cold and load on their first request."""
    check_names(options)
    factory = engine_factory if engine_factory is not None else native_engine_factory(options)
    metrics = ServerMetrics(options.model_name)
    admission = AdmissionQueue(QueueBounds(options.max_queued_requests, options.max_queued_tokens))
    first = factory()
    deps = ContainerDeps(
        engine_factory=factory,
        policy_factory=lambda profile: build_policy(options.scheduler, profile),
        profile_builder=lambda engine: calibrate_profile(
            engine,
            clock,
            options.model_name,
            options.b0,
            options.mean_output_tokens,
            options.max_model_len,
        ),
        clock=clock,
        metrics=metrics,
        admission=admission,
        keep_alive_s=options.keep_alive_s,
        on_state_change=lambda: None,
    )
    pool = ServerPool(options.containers, build_router(options.router), deps)
    pool.start(first)
    limits = ModelLimits(
        max_model_len=options.max_model_len,
        kv_capacity_tokens=first.num_total_blocks * first.block_size,
        default_max_tokens=options.default_max_tokens,
    )
    service = Service(
        pool, admission, first.tokenizer, metrics, limits, clock, options.retry_after_s
    )
    route_config = RouteConfig(
        model_name=options.model_name,
        api_key=options.api_key,
        disconnect_poll_s=options.disconnect_poll_s,
        unix_clock=unix_clock,
    )
    app = build_app(service, route_config, options.shutdown_timeout_s)
    return Server(app, service, pool, metrics, options)


def serve(options: ServeOptions) -> None:
    """Run the server until SIGINT/SIGTERM, then shut down gracefully: stop accepting new
    connections and requests (503), let open requests finish for up to
    ``shutdown_timeout_s`` seconds, abort the rest (their streams end cleanly), stop the
    engines."""
    import uvicorn

    logging.basicConfig(level=options.log_level.upper(), format="%(levelname)s %(message)s")
    server = build_server(options)
    config = uvicorn.Config(
        server.app,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        timeout_graceful_shutdown=math.ceil(options.shutdown_timeout_s + ABORT_GRACE_S + 1),
    )
    DrainingServer(config, server.service, options.shutdown_timeout_s).run()

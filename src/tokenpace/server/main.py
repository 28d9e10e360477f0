"""Assemble and run ``tokenpace serve``: checkpoint, tokenizer, pool, service, app, uvicorn."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fastapi import FastAPI

from tokenpace.core.cache import default_cache_dir
from tokenpace.core.registry import UnknownNameError
from tokenpace.engine.dtype import AUTO
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES
from tokenpace.pool.autoscaler import Autoscaler
from tokenpace.pool.router import ROUTERS, build_router
from tokenpace.pool.scaling import PoolScaler
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.server.admission import AdmissionQueue, QueueBounds
from tokenpace.server.app import ABORT_GRACE_S, build_app
from tokenpace.server.engines import ENGINE_CONFIGS, load_tokenizer, prepare_checkpoint
from tokenpace.server.inflight import ContainerDeps
from tokenpace.server.metrics import ServerMetrics
from tokenpace.server.options import EARLY_REJECT_SUFFIX, ServeOptions
from tokenpace.server.pool import ServerPool
from tokenpace.server.prompts import max_token_chars
from tokenpace.server.routes import RouteConfig
from tokenpace.server.service import ModelLimits, Service
from tokenpace.server.uvicorn_server import DrainingServer
from tokenpace.server.worker.wire import Calibration, WorkerSpec
from tokenpace.server.worker_handle import Launcher
from tokenpace.server.worker_process import WorkerProcess

logger = logging.getLogger("tokenpace.server")


class EngineStartError(RuntimeError):
    """The first engine of the pool could not start; the message says why."""


@dataclass(frozen=True, slots=True)
class Server:
    """A built server: ``app`` is ready for uvicorn, the pool's containers are running."""

    app: FastAPI
    service: Service
    pool: ServerPool
    metrics: ServerMetrics
    options: ServeOptions


def check_names(options: ServeOptions) -> None:
    """Raise ValueError naming the flag when the scheduler or router is unknown (the
    engine is checked by ``ServeOptions``)."""
    for flag, registry, name in (
        ("--scheduler", POLICIES, options.scheduler),
        ("--router", ROUTERS, options.router),
    ):
        try:
            registry.get(name)
        except UnknownNameError as error:
            raise ValueError(f"{flag}: {error}") from None
    if options.policy_name not in POLICIES:
        able = [n for n in POLICIES.names() if n + EARLY_REJECT_SUFFIX in POLICIES]
        raise ValueError(
            f"--early-reject: scheduler {options.scheduler!r} cannot predict a request's time "
            f"to first token; schedulers that can: {', '.join(able)}"
        )


def given_profile(options: ServeOptions) -> EngineProfile | None:
    """The profile ``--profile`` names (None when not given). Raises ValueError naming the
    flag when it names no shipped profile or readable profile file, or when the profile
    was measured in a precision other than an explicit ``--dtype``."""
    if options.profile is None:
        return None
    try:
        profile = load_profile(options.profile)
    except (OSError, ValueError) as error:
        raise ValueError(f"--profile: {error}") from None
    if options.dtype != AUTO and profile.dtype and profile.dtype != options.dtype:
        raise ValueError(
            f"--profile {options.profile!r} was measured in {profile.dtype}, but --dtype is "
            f"{options.dtype}: its step latencies do not hold for the engine"
        )
    return profile


def worker_spec(options: ServeOptions, checkpoint_dir: Path) -> WorkerSpec:
    """What each container's worker process builds its engine from: with ``--profile``,
    the policy's profile is that one and no engine measures its own at start."""
    cache_dir = options.cache_dir if options.cache_dir is not None else default_cache_dir()
    return WorkerSpec(
        engine=options.engine,
        engine_config=ENGINE_CONFIGS.get(options.engine)(options, checkpoint_dir),
        policy=options.policy_name,
        calibration=Calibration(
            options.model_name, options.b0, options.mean_output_tokens, options.max_model_len
        ),
        build_dir=cache_dir / f"{options.engine}-runtime",
        slo=Slo(options.slo_ttft_ms, options.slo_tpot_ms),
        online_calibration=OnlineCalibrationConfig() if options.online_calibration else None,
        profile=given_profile(options),
    )


def worker_launcher(
    options: ServeOptions, clock: Callable[[], float]
) -> tuple[Launcher, Callable[[], None]]:
    """How containers start their workers, and what to release when the pool stops: local
    processes, or actors on the Ray cluster ``--ray-address`` names (joined here; raises
    EngineStartError when it cannot be)."""
    if options.ray_address is None:
        return WorkerProcess.start, lambda: None
    from tokenpace.server.ray_workers import RayCluster, RayPlacement

    cpus = options.ray_cpus_per_engine
    placement = RayPlacement(
        options.ray_address,
        cpus_per_engine=cpus if cpus is not None else float(options.num_threads),
        gpus_per_engine=options.ray_gpus_per_engine,
    )
    cluster = RayCluster(placement, clock)
    try:
        cluster.connect()
    except ImportError:
        raise EngineStartError("--ray-address needs Ray: scripts/setup.sh ray") from None
    except (ConnectionError, RuntimeError, ValueError) as error:
        raise EngineStartError(
            f"--ray-address {options.ray_address!r}: cannot join the Ray cluster: {error}"
        ) from None
    return cluster.launch, cluster.close


def build_server(
    options: ServeOptions,
    clock: Callable[[], float] = time.perf_counter,
    unix_clock: Callable[[], float] = time.time,
    rng: np.random.Generator | None = None,
) -> Server:
    """Prepare the checkpoint, start the pool (the first ``warm_containers`` engines load
    now; the first must come up before this returns) and build the app. ``rng`` seeds
    sampled requests that carry no seed (default: fresh entropy). Raises EngineStartError
    when the first engine fails to start."""
    check_names(options)
    given_profile(options)  # a bad --profile fails before the checkpoint is converted
    checkpoint_dir = prepare_checkpoint(options)
    spec = worker_spec(options, checkpoint_dir)
    tokenizer = load_tokenizer(options.tokenizer or checkpoint_dir)
    metrics = ServerMetrics(options.model_name)
    admission = AdmissionQueue(QueueBounds(options.max_queued_requests, options.max_queued_tokens))
    launch, release = worker_launcher(options, clock)
    deps = ContainerDeps(
        spec=spec,
        clock=clock,
        metrics=metrics,
        admission=admission,
        keep_alive_s=options.keep_alive_s,
        on_state_change=lambda: None,
        stop_timeout_s=options.shutdown_timeout_s,
        launch=launch,
    )
    scaler = PoolScaler(
        Autoscaler(
            options.target_per_container,
            options.min_containers,
            options.max_containers or options.containers,
        ),
        options.scale_down_window_s,
    )
    pool = ServerPool(
        options.containers,
        build_router(options.router),
        deps,
        release,
        scaler,
        options.migration_batch_threshold,
    )
    pool.start(num_warm=options.warm_containers)
    first = pool.containers[0]
    if not first.ready.wait(options.start_timeout_s) or first.kv_capacity_tokens is None:
        error = first.start_error or f"not ready after {options.start_timeout_s} s"
        pool.stop(options.shutdown_timeout_s)
        raise EngineStartError(f"the {options.engine} engine did not start: {error}")
    rng = rng if rng is not None else np.random.default_rng(options.seed)
    limits = ModelLimits(
        max_model_len=options.max_model_len,
        kv_capacity_tokens=first.kv_capacity_tokens,
        default_max_tokens=options.default_max_tokens,
        max_token_chars=max_token_chars(tokenizer),
    )
    service = Service(
        pool, admission, tokenizer, metrics, limits, clock, options.retry_after_s, rng,
        rejects_early=options.rejects_early,
    )  # fmt: skip
    route_config = RouteConfig(
        model_name=options.model_name,
        api_key=options.api_key,
        disconnect_poll_s=options.disconnect_poll_s,
        unix_clock=unix_clock,
        stream_shutdown_grace_s=options.shutdown_timeout_s + ABORT_GRACE_S + 1.0,
        max_request_bytes=options.max_request_bytes,
        tokenizer_info=options.enable_tokenizer_info_endpoint,
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

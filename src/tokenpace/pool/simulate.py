"""Run one workload on the simulated pool: the entry point the bench calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.engine.sim import SimEngine
from tokenpace.metrics.slo import Slo
from tokenpace.policy import POLICIES, build_policy
from tokenpace.policy.twp_slo.policy import ABLATIONS as TWP_SLO_VARIANTS
from tokenpace.policy.twp_slo.policy import OPT_INS as TWP_SLO_OPT_INS
from tokenpace.pool.autoscaler import AUTOSCALERS, build_autoscaler
from tokenpace.pool.checkpoint import CheckpointStore
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.container import ColdStart, Container
from tokenpace.pool.migration import MigrationRecord
from tokenpace.pool.pool import Pool, ScaleOut
from tokenpace.pool.router import ROUTERS, build_router
from tokenpace.runtime.step_loop import StepLoop, StepRecord
from tokenpace.sim.kernel import EventKernel
from tokenpace.sim.server import PRIORITY_ARRIVAL
from tokenpace.workload.spec import RequestSpec, to_requests, true_output_lengths

DEFAULT_ROUTER = "least_loaded"
DEFAULT_AUTOSCALER = "concurrency"
# twp_slo and its ablations on the pool: the router and autoscaler read the policy's own
# window and token demand; the ablation ``twp_slo-no_pool_signal`` runs twp_slo behind the
# baselines' pair instead.
POOL_SIGNAL_ROUTER = "headroom"
POOL_SIGNAL_AUTOSCALER = "token_rate"
POOL_SIGNAL_POLICIES = frozenset({*TWP_SLO_VARIANTS, *TWP_SLO_OPT_INS})
NO_POOL_SIGNAL = "twp_slo-no_pool_signal"


@dataclass(frozen=True, slots=True)
class SchedulerSetup:
    """What a scheduler name in results means on the pool: the admission policy inside
    every container, the router in front of them and the autoscaler sizing the pool."""

    scheduler: str
    policy: str
    router: str
    autoscaler: str = DEFAULT_AUTOSCALER


# The paper's two routing baselines run FCFS admission inside containers.
_ROUTER_SCHEDULERS = {"round_robin": "fcfs", "serverlessllm": "fcfs"}
# Pool-level ablations: name -> the policy they run (behind the default router/autoscaler).
_POOL_ABLATIONS = {NO_POOL_SIGNAL: "twp_slo"}


def scheduler_names() -> list[str]:
    """Every name ``simulate_pool`` accepts: the policies, the routing baselines and the
    pool-level ablations."""
    return sorted({*POLICIES.names(), *_ROUTER_SCHEDULERS, *_POOL_ABLATIONS})


def resolve_scheduler(name: str, router: str | None = None) -> SchedulerSetup:
    """``round_robin`` and ``serverlessllm`` are FCFS behind that router; twp_slo and its
    ablations run behind ``router`` (default ``headroom``) with the ``token_rate``
    autoscaler; ``twp_slo-no_pool_signal`` and every other policy behind ``router``
    (default ``least_loaded``) with the ``concurrency`` autoscaler. Raises ValueError for
    an unknown name or a router that contradicts a routing baseline's own."""
    if name in _ROUTER_SCHEDULERS:
        if router is not None and router != name:
            raise ValueError(f"scheduler {name!r} is its own router; got router {router!r}")
        return SchedulerSetup(name, _ROUTER_SCHEDULERS[name], name)
    if name not in POLICIES and name not in _POOL_ABLATIONS:
        raise ValueError(
            f"unknown scheduler {name!r}; valid choices: {', '.join(scheduler_names())}"
        )
    signal = name in POOL_SIGNAL_POLICIES
    chosen = router or (POOL_SIGNAL_ROUTER if signal else DEFAULT_ROUTER)
    if chosen not in ROUTERS:
        raise ValueError(f"unknown router {chosen!r}; valid choices: {', '.join(ROUTERS.names())}")
    autoscaler = POOL_SIGNAL_AUTOSCALER if signal else DEFAULT_AUTOSCALER
    assert autoscaler in AUTOSCALERS
    return SchedulerSetup(name, _POOL_ABLATIONS.get(name, name), chosen, autoscaler)


@dataclass(frozen=True, slots=True)
class PoolOutcome:
    """Everything one pool run produced.

    ``requests``: every request in arrival order (ids 0..n-1), finished, with
    ``container_id`` (where it finished) and ``cold_start_s``. ``steps``: per container (index
    = container id) its step records (empty when not recorded). ``end_s``: when the last
    request finished (virtual seconds from the first arrival's clock origin).
    ``container_seconds``: loading or warm time summed over containers up to ``end_s`` (the
    serverless bill). ``num_computed_tokens``: tokens the engines computed, recompute and
    migration re-prefill included. ``scale_outs``: the autoscaler's starts, in time order.
    """

    setup: SchedulerSetup
    requests: list[Request]
    steps: tuple[list[StepRecord], ...]
    cold_starts: list[ColdStart]
    migrations: list[MigrationRecord]
    num_cancelled_migrations: int
    end_s: float
    num_events: int
    container_seconds: float = 0.0
    num_computed_tokens: int = 0
    scale_outs: tuple[ScaleOut, ...] = ()

    @property
    def num_cold_starts(self) -> int:
        return len(self.cold_starts)

    @property
    def num_migrations(self) -> int:
        return len(self.migrations)


class PoolSimulation:
    """A pool on its own event kernel, ready to take arrivals; ``simulate_pool`` drives one
    to completion, tests drive it step by step through ``kernel`` and ``pool``.

    Builds ``pool_config.num_containers`` containers, each with its own policy instance and
    SimEngine (its own random stream spawned from ``rng``); the first
    ``pool_config.initial_warm`` start warm at time 0.
    """

    def __init__(
        self,
        scheduler_name: str,
        profile: EngineProfile,
        pool_config: PoolConfig,
        rng: np.random.Generator,
        router: str | None = None,
        slo: Slo | None = None,
    ) -> None:
        self.setup = resolve_scheduler(scheduler_name, router)
        self.kernel = EventKernel()
        # Request id -> true output length, filled as arrivals are added; only the engines
        # read it (they stop requests there, as a model ending on EOS).
        self.output_lengths: dict[int, int] = {}
        self.pool = Pool(
            build_router(self.setup.router),
            build_autoscaler(self.setup.autoscaler, pool_config, profile, slo),
            pool_config.migration_batch_threshold,
            pool_config.migration_overhead_s,
            pool_config.scale_down_window_s,
            rebalance=self.setup.router == POOL_SIGNAL_ROUTER,
        )
        self.containers = build_containers(
            self.kernel, self.pool, self.setup.policy, profile, pool_config, rng, slo,
            self.output_lengths,
        )  # fmt: skip
        self.pool.attach(self.containers)
        for container in self.containers[: pool_config.initial_warm]:
            container.start_warm(0.0)
        self.requests: list[Request] = []

    def add_arrivals(self, specs: Sequence[RequestSpec]) -> list[Request]:
        """Schedule the arrivals of ``specs`` (ids continue from earlier calls)."""
        first_id = len(self.requests)
        requests = to_requests(specs)
        self.output_lengths.update(true_output_lengths(specs, first_id))
        for request in requests:
            request.request_id += first_id
            self.kernel.schedule(
                request.arrival_s, PRIORITY_ARRIVAL, partial(self.pool.submit, request)
            )
        self.requests.extend(requests)
        return requests

    def run(self, until_s: float = float("inf")) -> None:
        self.kernel.run(until_s)

    def outcome(self) -> PoolOutcome:
        """The outcome so far. Raises RuntimeError if a request has not finished."""
        unfinished = [r.request_id for r in self.requests if not r.is_done]
        if unfinished:
            raise RuntimeError(
                f"{self.setup.scheduler}: {len(unfinished)} requests never finished "
                f"(first: {unfinished[0]})"
            )
        migrator = self.pool.migrator
        cold_starts = [s for c in self.containers for s in c.cold_starts]
        cold_starts.sort(key=lambda s: (s.start_s, s.container_id))
        end_s = max((r.finished_s or 0.0 for r in self.requests), default=0.0)
        return PoolOutcome(
            setup=self.setup,
            requests=self.requests,
            steps=tuple(c.loop.steps for c in self.containers),
            cold_starts=cold_starts,
            migrations=list(migrator.records) if migrator else [],
            num_cancelled_migrations=migrator.num_cancelled if migrator else 0,
            end_s=end_s,
            num_events=self.kernel.num_events_handled,
            container_seconds=sum(c.container_seconds(end_s) for c in self.containers),
            num_computed_tokens=sum(c.loop.num_computed_tokens for c in self.containers),
            scale_outs=tuple(self.pool.scale_outs),
        )


def simulate_pool(
    specs: Sequence[RequestSpec],
    scheduler_name: str,
    profile: EngineProfile,
    pool_config: PoolConfig,
    rng: np.random.Generator,
    router: str | None = None,
    slo: Slo | None = None,
) -> PoolOutcome:
    """Replay ``specs`` through the pool (see ``PoolSimulation``) until every request has
    finished. The same ``rng`` state and inputs give the same outcome. Raises RuntimeError
    if a request never finishes and ValueError for an unknown scheduler or router."""
    simulation = PoolSimulation(scheduler_name, profile, pool_config, rng, router, slo)
    simulation.add_arrivals(specs)
    simulation.run()
    return simulation.outcome()


def build_containers(
    kernel: EventKernel,
    pool: Pool,
    policy_name: str,
    profile: EngineProfile,
    pool_config: PoolConfig,
    rng: np.random.Generator,
    slo: Slo | None = None,
    output_lengths: dict[int, int] | None = None,
) -> list[Container]:
    """Cold containers with their own policy (given ``slo``), engine stream and checkpoint
    caches (the checkpoint placed in ``pool_config.initial_tier`` on every server); their
    engines stop requests at ``output_lengths`` (shared, may grow)."""
    containers = []
    for container_id, stream in enumerate(rng.spawn(pool_config.num_containers)):
        store = CheckpointStore(pool_config.host_cache_bytes, pool_config.ssd_cache_bytes)
        store.place(profile.name, profile.checkpoint_bytes, pool_config.initial_tier)
        loop = StepLoop(
            build_policy(policy_name, profile, slo),
            SimEngine(profile, stream, output_lengths),
            record_steps=pool_config.record_steps,
        )
        containers.append(
            Container(container_id, kernel, loop, profile, store, pool_config.keep_alive_s, pool)
        )
    return containers

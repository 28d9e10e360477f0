"""Autoscaling rules, a registry like the routers.

``concurrency`` (the default): instances = ceil(outstanding requests / target per instance),
within [min, max]. ``token_rate``: instances for the token demand (``TokenRateAutoscaler``).
The pool asks a rule for the instances it wants at every arrival and completion
(``wanted(PoolSignal)``); scaling down follows the most it wanted over the scale-down window
(``LoadWindow``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.pool.config import PoolConfig


@dataclass(frozen=True, slots=True)
class PoolSignal:
    """What the pool tells its autoscaler at one instant.

    ``num_outstanding``: requests waiting or running in the pool (an arriving request
    included). ``arrival``: the request arriving now (None on a completion).
    ``arrival_output_tokens``: the output the containers' policies expect of it (their
    learned estimate; None when they have none). ``finished``: requests that finished now
    (their output lengths are known)."""

    now_s: float
    num_outstanding: int
    arrival: Request | None = None
    arrival_output_tokens: float | None = None
    finished: Sequence[Request] = ()


class ScalingRule(Protocol):
    """How many instances (warm or loading containers) the pool wants. ``wanted`` is called
    at every arrival (before routing) and every completion, in time order; a rule may keep
    state from the signals it has seen."""

    @property
    def min_instances(self) -> int: ...

    @property
    def max_instances(self) -> int: ...

    def wanted(self, signal: PoolSignal) -> int: ...


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """Concurrency-based scaling, as Knative-style serverless platforms do it.

    ``load`` is the number of outstanding requests in the pool (waiting or running);
    ``target_per_instance`` how many one instance should carry. Zero load with
    ``min_instances = 0`` gives zero instances: the pool scales to zero once idle
    containers pass their keep-alive.
    """

    target_per_instance: float
    min_instances: int
    max_instances: int

    def desired(self, load: int) -> int:
        """Instances wanted for ``load`` outstanding requests."""
        wanted = math.ceil(load / self.target_per_instance) if load > 0 else 0
        return max(self.min_instances, min(self.max_instances, wanted))

    def wanted(self, signal: PoolSignal) -> int:
        """``desired`` for the pool's outstanding requests."""
        return self.desired(signal.num_outstanding)


class LoadWindow:
    """The highest load seen over the last ``window_s`` seconds (a sliding maximum), so
    the pool scales down only after load has stayed low for a while (Knative's stable
    window) while it scales up on the load of the moment."""

    def __init__(self, window_s: float) -> None:
        if window_s < 0:
            raise ValueError(f"window_s must be >= 0, got {window_s}")
        self.window_s = window_s
        # [load, time it stopped being in effect (None: still is)], loads decreasing.
        self._entries: deque[list[float | None]] = deque()

    def record(self, now_s: float, load: int) -> None:
        """The load is ``load`` from ``now_s`` on."""
        entries = self._entries
        if entries and entries[-1][1] is None:
            entries[-1][1] = now_s
        while entries and (entries[-1][0] or 0) <= load:
            entries.pop()
        entries.append([float(load), None])

    def peak(self, now_s: float) -> int:
        """The largest load in effect during ``[now_s - window_s, now_s]`` (0 before any
        record)."""
        horizon = now_s - self.window_s
        entries = self._entries
        while entries and entries[0][1] is not None and entries[0][1] <= horizon:
            entries.popleft()
        return int(entries[0][0] or 0) if entries else 0


@dataclass(frozen=True, slots=True)
class TokenCapacity:
    """What one instance serves at its operating point, from the profile (paper Eq. 2).

    ``batch``: requests one instance runs together when its step latency sits at the ITL
    target (``itl_target_ms``, the TPOT objective times the policy's target fraction), less
    the reserve of one minimum prefill chunk and the mixing cost, as twp_slo sizes its
    window. ``decode_s_per_token``: container-seconds one output token costs there
    (l(batch) / batch). ``prefill_s_per_token`` and ``prefill_overhead_s``: a prompt's cost.
    """

    batch: float
    decode_s_per_token: float
    prefill_s_per_token: float
    prefill_overhead_s: float

    @classmethod
    def from_profile(cls, profile: EngineProfile, slo: Slo) -> TokenCapacity:
        # Imported here: the policy package is not needed to build the default autoscaler.
        from tokenpace.policy.twp_slo.config import TwpSloConfig
        from tokenpace.policy.twp_slo.window import profile_batch_target

        batch = profile_batch_target(TwpSloConfig.from_profile(profile, slo))
        step_ms = profile.l_min_ms + profile.alpha_ms * max(0.0, batch - profile.b0)
        return cls(
            batch=batch,
            decode_s_per_token=step_ms / batch / 1000,
            prefill_s_per_token=profile.prefill_ms_per_token / 1000,
            prefill_overhead_s=profile.mixed_prefill_overhead_ms / 1000,
        )

    def work_s(self, num_prompt_tokens: int, num_output_tokens: float) -> float:
        """Container-seconds one request costs: its prompt's prefill plus its output."""
        prefill = num_prompt_tokens * self.prefill_s_per_token + self.prefill_overhead_s
        return prefill + num_output_tokens * self.decode_s_per_token


class TokenRateAutoscaler:
    """Scaling on token demand instead of request concurrency (in the spirit of TokenScale,
    arXiv 2512.03416).

    Demand, in instances: the larger of (a) the rate term: the container-seconds per second
    that recent arrivals bring (each arrival's prompt and expected output tokens at the
    operating point's costs, ``TokenCapacity.work_s``), an exponentially weighted rate with
    time constant ``rate_time_constant_s``; and (b) the occupancy term: outstanding requests
    over the operating batch (how many instances' windows they fill). Wanted instances =
    ceil(demand / ``utilization``) within [min, max]. The rate term rises with the arrival
    rate itself, so cold starts begin as a burst arrives, before queues form; the occupancy
    term keeps instances for work already in the pool once arrivals slow.

    Defaults: ``utilization`` 0.5 and a 0.5 s time constant, because a cold start (seconds
    from SSD) outlasts a typical burst: capacity must already stand when the rate rises,
    not follow it (0.9 and 1 s left 7 requests queued per start and less goodput on the
    ``burst`` scenario, ``bench/pool_signal.py``).

    Expected output per request: the policies' own estimate when the pool passes it
    (``PoolSignal.arrival_output_tokens``: learned from finished requests with running ones
    censored, so not biased toward the short requests that finish first); otherwise the
    mean output of finished requests (exponentially weighted, ``output_smoothing``), and
    before any finished ``prior_output_tokens``, capped by the request's ``max_tokens``.
    """

    def __init__(
        self,
        capacity: TokenCapacity,
        min_instances: int,
        max_instances: int,
        utilization: float = 0.5,
        rate_time_constant_s: float = 0.5,
        prior_output_tokens: float = 50.0,
        output_smoothing: float = 0.05,
    ) -> None:
        for name, value in (
            ("utilization", utilization), ("rate_time_constant_s", rate_time_constant_s),
            ("prior_output_tokens", prior_output_tokens), ("output_smoothing", output_smoothing),
        ):  # fmt: skip
            if not value > 0:
                raise ValueError(f"TokenRateAutoscaler {name} must be positive, got {value}")
        if not 0 <= min_instances <= max_instances:
            raise ValueError(
                f"TokenRateAutoscaler needs 0 <= min_instances <= max_instances, got "
                f"{min_instances} and {max_instances}"
            )
        self.capacity = capacity
        self.min_instances = min_instances
        self.max_instances = max_instances
        self.utilization = utilization
        self.rate_time_constant_s = rate_time_constant_s
        self.output_smoothing = output_smoothing
        self.mean_output_tokens = prior_output_tokens
        self._seen_finished = False
        self._rate = 0.0  # container-seconds of work arriving per second
        self._rate_at_s = 0.0

    def work_rate(self, now_s: float) -> float:
        """The smoothed work arrival rate at ``now_s`` (container-seconds per second)."""
        return self._rate * math.exp(-(now_s - self._rate_at_s) / self.rate_time_constant_s)

    def demand(self, signal: PoolSignal) -> float:
        """Instances' worth of work at ``signal.now_s`` (before the utilization target)."""
        occupancy = signal.num_outstanding / self.capacity.batch
        return max(self.work_rate(signal.now_s), occupancy)

    def wanted(self, signal: PoolSignal) -> int:
        for request in signal.finished:
            self._learn(len(request.token_times_s))
        if signal.arrival is not None:
            self._arrive(signal.arrival, signal.arrival_output_tokens, signal.now_s)
        need = self.demand(signal) / self.utilization
        wanted = math.ceil(need - 1e-9) if need > 0 else 0
        return max(self.min_instances, min(self.max_instances, wanted))

    def _learn(self, num_output_tokens: int) -> None:
        if not self._seen_finished:
            self.mean_output_tokens = float(num_output_tokens)
            self._seen_finished = True
        else:
            delta = num_output_tokens - self.mean_output_tokens
            self.mean_output_tokens += self.output_smoothing * delta

    def _arrive(self, request: Request, expected_output: float | None, now_s: float) -> None:
        expected = self.mean_output_tokens if expected_output is None else expected_output
        if expected_output is None and not self._seen_finished:
            expected = min(expected, float(request.max_tokens))
        work = self.capacity.work_s(request.num_prompt_tokens, expected)
        self._rate = self.work_rate(now_s) + work / self.rate_time_constant_s
        self._rate_at_s = now_s


AutoscalerFactory = Callable[[PoolConfig, EngineProfile, Slo], ScalingRule]

AUTOSCALERS: Registry[AutoscalerFactory] = Registry("autoscaler")


@AUTOSCALERS.register("concurrency")
def _concurrency(config: PoolConfig, profile: EngineProfile, slo: Slo) -> ScalingRule:
    return Autoscaler(config.target_per_instance, config.min_instances, config.instance_ceiling)


@AUTOSCALERS.register("token_rate")
def _token_rate(config: PoolConfig, profile: EngineProfile, slo: Slo) -> ScalingRule:
    return TokenRateAutoscaler(
        TokenCapacity.from_profile(profile, slo), config.min_instances, config.instance_ceiling,
        prior_output_tokens=profile.mean_output_tokens,
    )  # fmt: skip


def build_autoscaler(
    name: str, config: PoolConfig, profile: EngineProfile, slo: Slo | None = None
) -> ScalingRule:
    """Instantiate the registered autoscaler ``name`` for the pool ``config``."""
    return AUTOSCALERS.get(name)(config, profile, slo if slo is not None else Slo())

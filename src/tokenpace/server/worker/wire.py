"""Messages between the server process and one engine worker process.

Everything here is a frozen dataclass of plain values, so it pickles across a
``multiprocessing`` pipe. Times are seconds on ``time.perf_counter``, which on Linux is the
system-wide monotonic clock, so the server and its workers read the same timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenpace.core.logprobs import TokenLogprob
from tokenpace.core.request import FinishReason
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.online import LiveProfile, OnlineCalibrationConfig


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request as the worker runs it. A request resumed on another container after a
    crash arrives with its already-delivered tokens appended to ``prompt_token_ids`` and
    ``max_tokens`` reduced by as many. ``rejectable``: whether the policy may still refuse
    it (early rejection); False once any container admitted it."""

    request_id: int
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    sampling: SamplingParams
    rejectable: bool = True


@dataclass(frozen=True, slots=True)
class Calibration:
    """How a worker builds its engine profile when it has none: the profile name, B0, the
    expected mean output length and the longest request (tokens)."""

    name: str
    b0: int
    mean_output_tokens: float
    max_model_len: int


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker process needs to build its backend: the engine registry name and its
    config, the policy registry name, the profile measured by an earlier incarnation (None:
    measure one), where build caches go, the SLO that SLO-targeted policies aim at, and the
    precision an earlier incarnation chose for ``auto`` (None: choose), and how the engine
    refits its profile from the steps it serves (None: the policy keeps the profile)."""

    engine: str
    engine_config: object
    policy: str
    calibration: Calibration
    profile: EngineProfile | None = None
    build_dir: Path | None = None
    slo: Slo = field(default_factory=Slo)
    dtype: str | None = None  # chosen by an earlier incarnation under --dtype auto
    online_calibration: OnlineCalibrationConfig | None = None


# -- server -> worker ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submit:
    items: tuple[WorkItem, ...]


@dataclass(frozen=True, slots=True)
class Abort:
    request_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AbortAll:
    pass


@dataclass(frozen=True, slots=True)
class Shutdown:
    pass


Command = Submit | Abort | AbortAll | Shutdown


# -- worker -> server ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine is loaded. ``load_s``: process start to ready (imports, weights,
    profile). ``kv_capacity_tokens``: the whole KV cache of this engine. ``dtype``: the
    precision it runs in; ``dtype_step_ms``: the decode step per candidate precision at
    ``dtype_batch`` requests when ``auto`` measured them (milliseconds; else empty)."""

    pid: int
    load_s: float
    profile: EngineProfile
    kv_capacity_tokens: int
    dtype: str = ""
    dtype_batch: int = 0
    dtype_step_ms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """A request left the engine. ``reason`` None means it failed; ``error`` says why
    (for a rejection, ``FinishReason.REJECT``, the policy's reason).
    ``num_preemptions`` and ``num_recomputed_tokens``: how often the engine preempted it
    and how many of its computed tokens that threw away (0 when the engine does not say)."""

    request_id: int
    reason: FinishReason | None
    num_output_tokens: int
    error: str | None = None
    num_preemptions: int = 0
    num_recomputed_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LoadState:
    """The engine's load after a step: requests, outstanding tokens (uncomputed prompt plus
    remaining output), KV blocks, the policy's telemetry and, under online calibration, the
    live profile's figures."""

    num_waiting: int = 0
    num_running: int = 0
    outstanding_tokens: int = 0
    num_used_blocks: int = 0
    num_total_blocks: int = 1
    telemetry: dict[str, float] = field(default_factory=dict)
    live_profile: LiveProfile | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """What happened since the last report: tokens ``(request_id, token_id, time_s)``,
    admissions ``(request_id, admitted_s)``, finished requests, and the load now.
    ``logprobs``: ``(request_id, entry)`` for each token of a request that asked for
    logprobs, in the order of ``tokens``; ``prompt_logprobs``: ``(request_id, entries)``
    of prompt positions 1.., sent once, before the request's first token."""

    tokens: tuple[tuple[int, int, float], ...]
    admitted: tuple[tuple[int, float], ...]
    finished: tuple[Finished, ...]
    load: LoadState
    logprobs: tuple[tuple[int, TokenLogprob], ...] = ()
    prompt_logprobs: tuple[tuple[int, tuple[TokenLogprob, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class Fault:
    """The engine failed (load or step); the worker exits after sending this."""

    error: str


Message = Ready | Report | Fault

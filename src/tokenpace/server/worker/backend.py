"""The step-level interface a worker drives, whatever engine sits behind it.

A backend owns one loaded engine and the scheduling policy in charge of it. The worker
feeds it requests and aborts between steps and calls ``step`` while ``has_work``; a
benchmark does the same through ``runtime.replay`` (one wall-clock arrival loop), changing
the policy between runs with ``use_policy``. Backends register under the engine names
``tokenpace serve --engine`` accepts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tokenpace.core.registry import Registry
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo
from tokenpace.profiling.probe import TimingProbe
from tokenpace.runtime.step_loop import StepRecord
from tokenpace.server.worker.dtype_choice import DtypeChoice
from tokenpace.server.worker.wire import Finished, LoadState, Report, WorkerSpec, WorkItem

Clock = Callable[[], float]


class ServingBackend(Protocol):
    """One engine under one policy, stepped by the worker loop."""

    @property
    def profile(self) -> EngineProfile:
        """The profile the policy was built from (measured at load when none was given)."""
        ...

    @property
    def kv_capacity_tokens(self) -> int: ...

    @property
    def dtype_choice(self) -> DtypeChoice:
        """The precision the engine runs in (and what ``auto`` measured to choose it)."""
        ...

    @property
    def has_work(self) -> bool: ...

    def add(self, items: Sequence[WorkItem]) -> list[Finished]:
        """Queue ``items``; returns a failed ``Finished`` for each one the engine refuses."""
        ...

    def abort(self, request_ids: Sequence[int]) -> list[Finished]:
        """Abort the named requests (unknown ids are ignored); their KV is freed now."""
        ...

    def abort_all(self) -> list[Finished]: ...

    def step(self) -> Report | None:
        """Run one engine step and report its tokens, admissions and finishes; None when
        nothing could run (the worker then waits briefly before trying again)."""
        ...

    def load_state(self) -> LoadState: ...

    def encode(self, text: str) -> list[int]:
        """``text`` as the engine's token ids; raises ValueError when it has no tokenizer."""
        ...

    def use_policy(
        self, name: str, profile: EngineProfile, slo: Slo, record_steps: bool = False
    ) -> None:
        """Put the registered policy ``name``, built from ``profile`` (KV facts from the
        live engine), in charge from the next step on, and start a new step record (kept
        only with ``record_steps``). Only while the backend has no work."""
        ...

    def step_records(self) -> list[StepRecord]:
        """The steps run since ``use_policy`` asked to record them (times on the
        backend's clock, seconds)."""
        ...

    def shutdown(self) -> None:
        """Abort everything and release the engine."""
        ...

    def timing_probe(self) -> TimingProbe:
        """The engine's timing probe for the profiling sweep; only while it has no work."""
        ...


BackendBuilder = Callable[[WorkerSpec, Clock], ServingBackend]

BACKENDS: Registry[BackendBuilder] = Registry("engine")

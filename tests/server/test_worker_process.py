"""One engine worker process driven over its pipe, as a container drives it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from multiprocessing.connection import wait

import pytest

from tokenpace.core.request import FinishReason
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.profile import load_profile
from tokenpace.server.worker.wire import (
    Abort,
    Calibration,
    Finished,
    Message,
    Report,
    Submit,
    WorkerSpec,
    WorkItem,
)
from tokenpace.server.worker_handle import WorkerGone
from tokenpace.server.worker_process import WorkerProcess

pytestmark = pytest.mark.slow


def native_spec(profile: str) -> WorkerSpec:
    """A float32 engine that takes the suite's measured ``profile`` (no calibration)."""
    from tokenpace.engine.native import NativeEngineConfig

    config = NativeEngineConfig(dtype="float32", kv_cache_tokens=4096, max_model_len=512)
    calibration = Calibration("test", 8, 16.0, 512)
    return WorkerSpec("native", config, "twp", calibration, profile=load_profile(profile))


@pytest.fixture()
def worker(native_profile: str) -> Iterator[WorkerProcess]:
    process = WorkerProcess.start(native_spec(native_profile), "tokenpace-engine-test")
    yield process
    process.stop(5.0)


def item(request_id: int, max_tokens: int, prompt: tuple[int, ...] = (1, 2, 3, 4)) -> WorkItem:
    sampling = SamplingParams(ignore_eos=True)
    return WorkItem(request_id, prompt, max_tokens, time.perf_counter(), sampling)


def collect(worker: WorkerProcess, until: int, timeout_s: float = 60.0) -> list[Message]:
    """Messages until ``until`` requests have finished."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while sum(len(m.finished) for m in messages if isinstance(m, Report)) < until:
        assert time.monotonic() < deadline, "the worker did not finish the requests"
        wait(worker.wait_sources(), 1.0)
        messages.extend(worker.read_available())
    return messages


def test_tokens_admissions_finishes_and_aborts_cross_the_pipe(
    worker: WorkerProcess, native_profile: str
) -> None:
    ready = worker.wait_ready(lambda: False)
    assert ready.pid == worker.pid and ready.kv_capacity_tokens == 4096
    # The given profile is the policy's: the worker measured none of its own.
    assert ready.profile == load_profile(native_profile)
    worker.send(Submit((item(1, 5), item(2, 400))))
    messages = collect(worker, until=1)
    reports = [m for m in messages if isinstance(m, Report)]
    tokens = [t for r in reports for t in r.tokens if t[0] == 1]
    assert len(tokens) == 5
    assert [t[2] for t in tokens] == sorted(t[2] for t in tokens)
    assert {rid for r in reports for rid, _ in r.admitted} == {1, 2}
    assert reports[-1].finished[0] == Finished(1, FinishReason.LENGTH, 5)
    worker.send(Abort((2, 99)))
    messages = collect(worker, until=1)
    last = [m for m in messages if isinstance(m, Report)][-1]
    aborted = last.finished[0]
    assert aborted.request_id == 2 and aborted.reason is FinishReason.ABORT
    assert last.load.num_used_blocks == 0 and last.load.num_running == 0


def test_a_failing_step_is_reported_and_ends_the_worker(worker: WorkerProcess) -> None:
    worker.wait_ready(lambda: False)
    # A token id far beyond the vocabulary makes the model's embedding lookup raise.
    worker.send(Submit((item(7, 4, prompt=(10**9,)),)))
    with pytest.raises(WorkerGone, match="engine error: IndexError"):
        for _ in range(120):
            wait(worker.wait_sources(), 1.0)
            worker.read_available()
    assert worker.fault is not None

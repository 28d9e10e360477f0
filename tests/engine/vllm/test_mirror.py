"""The request mirror: vLLM requests as tokenpace requests, updated step by step."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tokenpace.core.request import FinishReason, RequestStatus
from tokenpace.engine.vllm.mirror import RequestMirror


@dataclass
class FakeEngineRequest:
    request_id: str
    num_prompt_tokens: int
    max_tokens: int | None
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)


def _mirror_with(n: int) -> tuple[RequestMirror, list[FakeEngineRequest]]:
    mirror = RequestMirror()
    engine_requests = [FakeEngineRequest(f"r{i}", 10 + i, 5) for i in range(n)]
    for i, request in enumerate(engine_requests):
        mirror.add(request, now_s=float(i), step_index=i)
    return mirror, engine_requests


def test_add_queues_in_arrival_order_with_integer_ids() -> None:
    mirror, engine_requests = _mirror_with(3)
    assert mirror.waiting.request_ids.tolist() == [0, 1, 2]
    assert mirror.waiting.num_prompt_tokens.tolist() == [10, 11, 12]
    assert mirror.waiting.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert mirror.waiting.enqueued_step.tolist() == [0, 1, 2]
    assert mirror.engine_request(1) is engine_requests[1]
    with pytest.raises(ValueError, match="already mirrored"):
        mirror.add(engine_requests[0], 0.0, 0)


def test_admit_removes_from_queue_and_marks_running() -> None:
    mirror, _ = _mirror_with(3)
    admitted = mirror.admit(["r2", "r0"], now_s=5.0)
    assert [r.request_id for r in admitted] == [2, 0]
    assert all(r.status is RequestStatus.RUNNING and r.admitted_s == 5.0 for r in admitted)
    assert mirror.waiting.request_ids.tolist() == [1]


def test_sync_copies_progress_and_stamps_new_tokens() -> None:
    mirror, engine_requests = _mirror_with(1)
    mirror.admit(["r0"], 1.0)
    engine = engine_requests[0]
    engine.num_computed_tokens = 10
    engine.output_token_ids.append(7)
    request = mirror.sync(engine, 2.0)
    assert request is not None
    assert request.output_token_ids == [7] and request.token_times_s == [2.0]
    assert request.num_computed_tokens == 10
    assert request.remaining_output_tokens == 4
    engine.output_token_ids.extend([8, 9])
    mirror.sync(engine, 3.0)
    assert request.token_times_s == [2.0, 3.0, 3.0]


def test_sync_clamps_computed_tokens_counted_ahead_by_async_placeholders() -> None:
    mirror, engine_requests = _mirror_with(1)
    mirror.admit(["r0"], 0.0)
    engine_requests[0].num_computed_tokens = 50
    request = mirror.sync(engine_requests[0], 1.0)
    assert request is not None and request.num_computed_tokens == request.num_tokens


def test_preempt_returns_to_front_in_order_and_resets_progress() -> None:
    mirror, engine_requests = _mirror_with(4)
    mirror.admit(["r0", "r1"], 0.0)
    engine_requests[0].num_computed_tokens = 10
    mirror.sync(engine_requests[0], 0.5)
    mirror.preempt(["r1", "r0"], step_index=9)
    assert mirror.waiting.request_ids.tolist() == [1, 0, 2, 3]
    first = mirror.waiting[0]
    assert first.status is RequestStatus.WAITING and first.num_preemptions == 1
    assert mirror.waiting[1].num_computed_tokens == 0
    assert mirror.waiting.enqueued_step.tolist()[:2] == [9, 9]


def test_finish_retires_waiting_and_running_requests() -> None:
    mirror, _ = _mirror_with(3)
    mirror.admit(["r0"], 0.0)
    done = mirror.finish("r0", 4.0, FinishReason.LENGTH)
    aborted = mirror.finish("r2", 4.0, FinishReason.ABORT)
    assert done is not None and done.status is RequestStatus.FINISHED and done.finished_s == 4.0
    assert aborted is not None and aborted.status is RequestStatus.ABORTED
    assert mirror.waiting.request_ids.tolist() == [1]
    assert len(mirror) == 1 and "r0" not in mirror
    assert mirror.finish("r0", 5.0, FinishReason.STOP) is None


def test_missing_max_tokens_counts_as_one() -> None:
    mirror = RequestMirror()
    request = mirror.add(FakeEngineRequest("x", 3, None), 0.0, 0)
    assert request.max_tokens == 1


def test_mirrors_keeps_engine_order_and_skips_unknown() -> None:
    mirror, engine_requests = _mirror_with(3)
    stranger = FakeEngineRequest("zz", 1, 1)
    found = mirror.mirrors([engine_requests[2], stranger, engine_requests[0]])
    assert [r.request_id for r in found] == [2, 0]

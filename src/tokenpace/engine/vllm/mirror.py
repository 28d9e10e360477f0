"""vLLM's requests mirrored, incrementally, as tokenpace ``Request`` objects.

The scheduler keeps one mirror for its whole life. Each vLLM request gets a tokenpace
``Request`` (integer id, engine-side monotonic times) when it arrives; the mirror's
``WaitingQueue`` holds the ones waiting for admission in vLLM's queue order, so a policy sees
the same columnar queue as in tokenpace's own step loop. Only the requests that changed in a
step are touched: admitted, preempted, progressed or finished ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import FinishReason, Request, RequestStatus


class EngineRequest(Protocol):
    """The attributes of a vLLM ``vllm.v1.request.Request`` the mirror reads."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int | None
    num_computed_tokens: int

    @property
    def output_token_ids(self) -> Sequence[int]: ...


class RequestMirror:
    """Tokenpace requests for the live vLLM requests, keyed both ways.

    Contract: every engine request is ``add``-ed once before any other call names it, and
    ``finish``-ed at most once, after which its ids are forgotten. ``waiting`` is in vLLM's
    queue order as long as the caller reports admissions and preemptions in order.
    """

    def __init__(self) -> None:
        self.waiting = WaitingQueue()
        self._requests: dict[str, Request] = {}
        self._engine_requests: dict[int, EngineRequest] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, engine_id: object) -> bool:
        return engine_id in self._requests

    def add(self, engine_request: EngineRequest, now_s: float, step_index: int) -> Request:
        """Mirror a newly arrived request as waiting, at the back of the queue."""
        engine_id = engine_request.request_id
        if engine_id in self._requests:
            raise ValueError(f"vLLM request {engine_id!r} is already mirrored")
        request = Request(
            request_id=self._next_id,
            num_prompt_tokens=max(1, engine_request.num_prompt_tokens),
            max_tokens=max(1, engine_request.max_tokens or 1),
            arrival_s=now_s,
            queued_s=now_s,
            enqueued_step=step_index,
        )
        self._next_id += 1
        self._requests[engine_id] = request
        self._engine_requests[request.request_id] = engine_request
        self.waiting.append(request)
        return request

    def get(self, engine_id: str) -> Request | None:
        return self._requests.get(engine_id)

    def engine_request(self, request_id: int) -> EngineRequest:
        """The vLLM request behind mirrored request ``request_id``; KeyError if unknown."""
        return self._engine_requests[request_id]

    def engine_request_by_id(self, engine_id: str) -> EngineRequest | None:
        request = self._requests.get(engine_id)
        return None if request is None else self._engine_requests[request.request_id]

    def mirrors(self, engine_requests: Iterable[EngineRequest]) -> list[Request]:
        """The mirrors of ``engine_requests``, in that order (unmirrored ones are left out)."""
        found = (self._requests.get(r.request_id) for r in engine_requests)
        return [request for request in found if request is not None]

    def admit(self, engine_ids: Sequence[str], now_s: float) -> list[Request]:
        """Mark requests vLLM just scheduled from its waiting queue as running; returns them
        in the given order."""
        admitted = [self._requests[engine_id] for engine_id in engine_ids]
        queued = [r.request_id for r in admitted if r.status is RequestStatus.WAITING]
        self.waiting.remove(queued)
        for request in admitted:
            request.status = RequestStatus.RUNNING
            if request.admitted_s is None:
                request.admitted_s = now_s
        return admitted

    def preempt(self, engine_ids: Sequence[str], step_index: int) -> None:
        """Requests vLLM preempted (recompute) go back to the front of the queue; the first
        id ends up first."""
        for engine_id in reversed(engine_ids):
            request = self._requests[engine_id]
            if request.status is not RequestStatus.RUNNING:
                continue
            request.status = RequestStatus.WAITING
            request.num_computed_tokens = 0
            request.num_preemptions += 1
            request.enqueued_step = step_index
            self.waiting.appendleft(request)

    def sync(self, engine_request: EngineRequest, now_s: float) -> Request | None:
        """Copy progress: computed tokens, and each new output token stamped ``now_s``."""
        request = self._requests.get(engine_request.request_id)
        if request is None:
            return None
        outputs = engine_request.output_token_ids
        new = outputs[request.num_output_tokens :]
        if new:
            request.output_token_ids.extend(int(t) for t in new)
            request.token_times_s.extend([now_s] * len(new))
        if request.status is RequestStatus.RUNNING:
            computed = engine_request.num_computed_tokens
            request.num_computed_tokens = min(computed, request.num_tokens)
        return request

    def finish(self, engine_id: str, now_s: float, reason: FinishReason) -> Request | None:
        """Retire a request (leaving the queue if it waits); None if it is not mirrored."""
        request = self._requests.pop(engine_id, None)
        if request is None:
            return None
        del self._engine_requests[request.request_id]
        if request.status is RequestStatus.WAITING:
            self.waiting.remove([request.request_id])
        request.status = (
            RequestStatus.ABORTED if reason is FinishReason.ABORT else RequestStatus.FINISHED
        )
        request.finish_reason = reason
        request.finished_s = now_s
        return request

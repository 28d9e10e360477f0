"""The scheduler's own per-step record: what the policy chose and what vLLM admitted."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from tokenpace.engine.latency_model import PrefillChunk, StepShape
from tokenpace.runtime.step_loop import StepRecord


@dataclass(frozen=True, slots=True)
class SchedulerStepRecord:
    """One ``schedule()`` call. Ids are the mirror's integer request ids.

    ``planned_ids``: the policy's admissions in its order; ``liveness_ids``: the head of the
    queue admitted because the policy admitted nothing while nothing ran (see the scheduler);
    ``admitted_ids``: the ones vLLM actually started this step, a subsequence of planned +
    liveness in the same order (vLLM may stop early on its token budget, ``max_num_seqs`` or
    KV blocks). Token loads count remaining output tokens (max_tokens - produced):
    ``token_load_before`` over the running batch, ``token_load_after`` with the admitted
    requests added, ``forced_load`` the part contributed by force-admitted ones.
    ``token_window`` is the policy's window when it has one (TWP), else None.
    ``num_decode_tokens`` counts the scheduled requests that decode (``step_shape``); the
    rest of ``num_scheduled_tokens`` are prefill tokens. ``planned_tokens``: the step's
    token budget set from the plan for a policy whose token counts bind (``step_tokens``),
    else None. ``shape``: the step's decode contexts and prefill chunks (``step_shape``).
    """

    step_index: int
    start_s: float
    last_step_latency_s: float | None
    num_running: int
    num_waiting: int
    num_free_blocks: int
    num_total_blocks: int
    planned_ids: tuple[int, ...]
    liveness_ids: tuple[int, ...]
    admitted_ids: tuple[int, ...]
    forced_ids: tuple[int, ...]
    token_window: float | None
    token_load_before: float
    token_load_after: float
    forced_load: float
    num_scheduled_tokens: int
    num_decode_tokens: int
    num_preempted: int
    telemetry: Mapping[str, float]
    planned_tokens: int | None = None
    shape: StepShape | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class StepLog:
    """The last ``max_records`` step records in memory, optionally appended to a JSON-lines
    file as well (one object per line, flushed per record)."""

    def __init__(self, max_records: int, path: Path | None = None) -> None:
        self._records: deque[SchedulerStepRecord] = deque(maxlen=max_records)
        self._path = path
        self._sink: TextIO | None = None

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[SchedulerStepRecord]:
        return iter(tuple(self._records))

    def records(self) -> list[SchedulerStepRecord]:
        return list(self._records)

    def append(self, record: SchedulerStepRecord) -> None:
        self._records.append(record)
        if self._path is not None:
            if self._sink is None:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._sink = self._path.open("a", encoding="utf-8")
            self._sink.write(record.to_json() + "\n")
            self._sink.flush()

    def clear(self) -> None:
        self._records.clear()

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()
            self._sink = None


def to_step_records(records: list[SchedulerStepRecord]) -> list[StepRecord]:
    """``records`` (consecutive steps) in the format of tokenpace's own step loop, for
    results and figures. A step's latency is the one measured when the next step was
    planned (the last step's is unknown: 0)."""
    steps = []
    for i, step in enumerate(records):
        following = records[i + 1] if i + 1 < len(records) else None
        latency = following.last_step_latency_s if following is not None else None
        steps.append(
            StepRecord(
                step_index=step.step_index,
                start_s=step.start_s,
                latency_s=latency or 0.0,
                num_running=step.num_running + len(step.admitted_ids),
                num_waiting=step.num_waiting - len(step.admitted_ids),
                num_decode_tokens=step.num_decode_tokens,
                num_prefill_tokens=step.num_scheduled_tokens - step.num_decode_tokens,
                num_admitted=len(step.admitted_ids),
                num_forced=len(step.forced_ids),
                num_preempted=step.num_preempted,
                num_used_blocks=step.num_total_blocks - step.num_free_blocks,
                telemetry=step.telemetry,
                shape=step.shape,
            )
        )
    return steps


def step_shape(output: Any, requests: Mapping[str, Any]) -> StepShape:
    """The shape of the step vLLM scheduled (its ``SchedulerOutput``; ``requests``: vLLM's
    requests by id): each scheduled request's tokens and the tokens it had computed before
    the step, as vLLM hands them to its workers (``scheduled_new_reqs`` and
    ``scheduled_cached_reqs``). A request decodes when one token of it was uncomputed and it
    has generated before (as ``StepShape.of`` counts); anything else is a prefill chunk, a
    one-token chunk of a prompt included."""
    computed = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    decode: list[int] = []
    prefill: list[PrefillChunk] = []
    for req_id, num_tokens in output.num_scheduled_tokens.items():
        start = computed.get(req_id, 0)
        request = requests.get(req_id)
        num_output = len(request.output_token_ids) if request is not None else 0
        num_prompt = request.num_prompt_tokens if request is not None else start + num_tokens
        if num_output and num_prompt + num_output - start == 1:
            decode.append(start)
        else:
            prefill.append(PrefillChunk(num_tokens, start))
    return StepShape(tuple(decode), tuple(prefill))

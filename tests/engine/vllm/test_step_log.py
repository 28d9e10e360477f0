"""The scheduler's step log: bounded in memory, optionally mirrored to JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

from tokenpace.engine.vllm.step_log import SchedulerStepRecord, StepLog


def _record(step: int) -> SchedulerStepRecord:
    return SchedulerStepRecord(
        step_index=step,
        start_s=float(step),
        last_step_latency_s=None if step == 0 else 0.04,
        num_running=1,
        num_waiting=2,
        num_free_blocks=10,
        num_total_blocks=20,
        planned_ids=(3, 1),
        liveness_ids=(),
        admitted_ids=(3,),
        forced_ids=(),
        token_window=400.0,
        token_load_before=10.0,
        token_load_after=42.0,
        forced_load=0.0,
        num_scheduled_tokens=65,
        num_decode_tokens=1,
        num_preempted=0,
        telemetry={"token_window": 400.0},
    )


def test_keeps_the_newest_records_only() -> None:
    log = StepLog(max_records=2)
    for step in range(3):
        log.append(_record(step))
    assert [r.step_index for r in log] == [1, 2]


def test_writes_one_json_object_per_step(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "steps.jsonl"
    log = StepLog(max_records=1, path=path)
    log.append(_record(0))
    log.append(_record(1))
    log.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step_index"] for line in lines] == [0, 1]
    assert lines[1]["admitted_ids"] == [3] and lines[1]["token_window"] == 400.0

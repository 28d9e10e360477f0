"""Step latency measured from the scheduler's schedule and update calls."""

from __future__ import annotations

import pytest

from tokenpace.engine.vllm.timing import StepTimer


def test_first_step_after_idle_runs_from_its_schedule_call() -> None:
    timer = StepTimer()
    timer.scheduled(10.0, num_tokens=5)
    assert timer.completed(10.3, num_tokens=5, still_busy=True) == pytest.approx(0.3)


def test_back_to_back_steps_measure_update_to_update() -> None:
    timer = StepTimer()
    timer.scheduled(0.0, 5)
    timer.completed(0.1, 5, still_busy=True)
    timer.scheduled(0.12, 3)  # engine overhead between steps is part of the ITL
    assert timer.completed(0.2, 3, still_busy=True) == pytest.approx(0.1)
    assert timer.last_latency_s == pytest.approx(0.1)


def test_async_scheduling_overlap_gives_the_update_cadence() -> None:
    timer = StepTimer()
    timer.scheduled(0.0, 4)
    timer.scheduled(0.01, 4)  # next step scheduled before the first one's update
    assert timer.completed(0.05, 4, still_busy=True) == pytest.approx(0.05)
    assert timer.completed(0.09, 4, still_busy=True) == pytest.approx(0.04)


def test_idle_gap_is_not_counted() -> None:
    timer = StepTimer()
    timer.scheduled(0.0, 1)
    timer.completed(0.1, 1, still_busy=False)
    timer.scheduled(5.0, 1)
    assert timer.completed(5.2, 1, still_busy=True) == pytest.approx(0.2)


def test_empty_steps_are_ignored() -> None:
    timer = StepTimer()
    timer.scheduled(0.0, 0)
    assert timer.completed(0.5, 0, still_busy=True) is None
    assert timer.last_latency_s is None

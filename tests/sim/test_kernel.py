from __future__ import annotations

import pytest

from tokenpace.sim.kernel import EventKernel


def test_order_is_time_then_priority_then_sequence() -> None:
    kernel = EventKernel()
    log: list[str] = []
    kernel.schedule(2.0, 1, lambda t: log.append("t2-p1-first"))
    kernel.schedule(1.0, 5, lambda t: log.append("t1"))
    kernel.schedule(2.0, 0, lambda t: log.append("t2-p0"))
    kernel.schedule(2.0, 1, lambda t: log.append("t2-p1-second"))
    kernel.run()
    assert log == ["t1", "t2-p0", "t2-p1-first", "t2-p1-second"]
    assert kernel.now_s == 2.0


def test_handlers_can_schedule_and_the_past_is_refused() -> None:
    kernel = EventKernel()
    seen: list[float] = []

    def tick(t: float) -> None:
        seen.append(t)
        if t < 3:
            kernel.schedule(t + 1, 0, tick)

    kernel.schedule(0.0, 0, tick)
    kernel.run(until_s=2.5)
    assert seen == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="before now"):
        kernel.schedule(1.0, 0, tick)

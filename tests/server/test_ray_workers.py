"""Parts of the Ray placement that need no cluster: the clock alignment handshake and the
placement settings."""

from __future__ import annotations

import threading
import time
from multiprocessing import Pipe

import pytest

from tokenpace.server.ray_workers import (
    RayPlacement,
    answer_clock_probes,
    measure_clock_offset,
)


def test_the_measured_offset_maps_worker_readings_onto_the_server_clock() -> None:
    server_end, worker_end = Pipe(duplex=True)
    shift_s = 1000.0  # the server's clock runs 1000 s behind the worker's monotonic clock
    answered: list[float] = []
    worker = threading.Thread(target=lambda: answered.append(answer_clock_probes(worker_end)))
    worker.start()
    offset = measure_clock_offset(server_end, lambda: time.perf_counter() - shift_s)
    worker.join(10)
    assert answered == [offset]  # the worker received the offset the server computed
    # Within half the shortest round trip; a generous bound for a loaded machine.
    assert offset == pytest.approx(shift_s, abs=0.5)


def test_a_worker_that_answers_something_else_is_refused() -> None:
    server_end, worker_end = Pipe(duplex=True)
    worker_end.send("not a reading")
    from tokenpace.server.worker_handle import WorkerGone

    with pytest.raises(WorkerGone, match="clock probe"):
        measure_clock_offset(server_end, time.perf_counter)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"address": "", "cpus_per_engine": 1.0}, "address"),
        ({"address": "auto", "cpus_per_engine": 0.0}, "cpus_per_engine"),
        ({"address": "auto", "cpus_per_engine": 1.0, "gpus_per_engine": -1.0}, "gpus_per_engine"),
    ],
)
def test_placement_settings_name_the_bad_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        RayPlacement(**fields)  # type: ignore[arg-type]

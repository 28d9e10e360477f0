"""The native worker backend's precision: a profile given to it fixes the precision."""

from __future__ import annotations

import time
from dataclasses import replace

from tokenpace.engine.native import NativeEngineConfig
from tokenpace.engine.profile import load_profile
from tokenpace.server.worker.dtype_choice import DtypeChoice
from tokenpace.server.worker.native_backend import DTYPE_MIN_BATCH, build_native
from tokenpace.server.worker.wire import Calibration, WorkerSpec


def test_auto_runs_in_the_precision_the_given_profile_was_measured_in() -> None:
    # A profile's latencies hold for the precision it was measured in; under auto the
    # worker loads that one instead of timing candidates (which could pick another).
    profile = replace(load_profile("v100-llama-3.2-3b"), dtype="float32")
    spec = WorkerSpec(
        engine="native",
        engine_config=NativeEngineConfig(dtype="auto", kv_cache_tokens=4096),
        policy="fcfs",
        calibration=Calibration("smollm2", 1, 50.0, 2048),
        profile=profile,
    )
    backend = build_native(spec, time.perf_counter)
    try:
        assert backend.dtype_choice == DtypeChoice("float32", DTYPE_MIN_BATCH)
        assert "float32" in backend.timing_probe().description
    finally:
        backend.shutdown()

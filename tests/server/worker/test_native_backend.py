"""The native worker backend's precision under ``auto``: what fixes it without measuring."""

from __future__ import annotations

from dataclasses import replace

from tokenpace.engine.native import NativeEngineConfig
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.server.worker.native_backend import fixed_dtype
from tokenpace.server.worker.wire import Calibration, WorkerSpec


def _spec(profile: EngineProfile | None = None, dtype: str | None = None) -> WorkerSpec:
    return WorkerSpec(
        engine="native",
        engine_config=NativeEngineConfig(dtype="auto"),
        policy="fcfs",
        calibration=Calibration("smollm2", 1, 50.0, 2048),
        profile=profile,
        dtype=dtype,
    )


def test_a_given_profile_fixes_the_precision_it_was_measured_in() -> None:
    # A profile's latencies hold for its precision only: auto must not pick another.
    measured = replace(load_profile("v100-llama-3.2-3b"), dtype="bfloat16")
    assert fixed_dtype(_spec(profile=measured)) == "bfloat16"
    # An earlier incarnation's choice comes first; a profile that does not say, or none,
    # leaves the choice to the measurement.
    assert fixed_dtype(_spec(profile=measured, dtype="float32")) == "float32"
    assert fixed_dtype(_spec(profile=load_profile("v100-llama-3.2-3b"))) is None
    assert fixed_dtype(_spec()) is None

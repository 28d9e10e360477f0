"""``--dtype auto`` in a worker: the precision with the faster measured decode step wins."""

from __future__ import annotations

import pytest

from tokenpace.server.worker.dtype_choice import choose_dtype


def run(step_s: dict[str, float]) -> tuple[str, list[str], tuple[tuple[str, float], ...]]:
    events: list[str] = []

    def load(dtype: str) -> str:
        events.append(f"load {dtype}")
        return dtype

    def warm_up(engine: str) -> None:
        events.append(f"warm {engine}")

    def decode_steps_s(engine: str, batch: int) -> list[float]:
        assert batch == 8
        return [step_s[engine] * 1.3, step_s[engine], step_s[engine] * 1.01]

    chosen = choose_dtype(load, warm_up, decode_steps_s, batch=8)
    assert chosen.engine == chosen.choice.dtype
    return chosen.choice.dtype, events, chosen.choice.step_ms


def test_the_faster_precision_is_kept_with_both_medians() -> None:
    dtype, events, step_ms = run({"float32": 0.249, "bfloat16": 0.345})
    assert dtype == "float32"
    assert events == ["load float32", "warm float32", "load bfloat16", "warm bfloat16"]
    assert dict(step_ms) == pytest.approx({"float32": 249 * 1.01, "bfloat16": 345 * 1.01})


def test_bfloat16_wins_where_it_is_faster() -> None:
    dtype, _, step_ms = run({"float32": 0.092, "bfloat16": 0.056})
    assert dtype == "bfloat16"
    assert dict(step_ms)["bfloat16"] == pytest.approx(56 * 1.01)

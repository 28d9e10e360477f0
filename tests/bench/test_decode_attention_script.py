"""bench/decode_attention.py on the tiny random model: the whole path, two small points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the native engine needs the native extra")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "decode_attention.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}


@pytest.mark.native
@pytest.mark.slow
def test_a_small_run_times_both_engines_per_point() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "random:tiny-llama", "--dtype", "float32",
         "--num-threads", "1", "--points", "2,5,5,3,4,40", "--steps", "2", "--rounds", "1"],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    if "decode_attention ragged:" in done.stderr:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # What auto takes is measured: ragged, or the padded call (sdpa, products<=N).
    assert result["auto_choice"] == "ragged" or result["auto_choice"].startswith(
        ("sdpa", "products<=")
    )
    assert [(p["batch"], p["contexts"]) for p in result["points"]] == [(2, [5, 5]), (3, [4, 40])]
    for point in result["points"]:
        assert point["ragged_ms"] > 0 and point["sdpa_ms"] > 0
        assert point["sdpa_over_ragged"] == pytest.approx(
            point["sdpa_ms"] / point["ragged_ms"], rel=0.01
        )
    assert result["uniform_sdpa_over_ragged"] == result["points"][0]["sdpa_over_ragged"]
    assert result["mixed_sdpa_over_ragged"] == result["points"][1]["sdpa_over_ragged"]


def test_points_that_are_not_triples_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--points", "2,5"],
        capture_output=True, text=True, timeout=120, env=ENV,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--points takes triples (batch, shortest, longest), got (2, 5)" in done.stderr

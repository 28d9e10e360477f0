"""results.json and requests.csv (DESIGN.md section 4)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tokenpace.bench.matrix import CellResult

REQUEST_COLUMNS = (
    "scheduler", "workload", "engine", "seed", "request_id", "arrival_s", "admitted_s",
    "first_token_s", "finished_s", "num_prompt_tokens", "max_tokens", "num_output_tokens",
    "num_preemptions", "num_recomputed_tokens", "container_id", "cold_start_s", "status",
    "token_times_s",
)  # fmt: skip


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: write null instead, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_results_json(
    path: Path,
    config: Mapping[str, Any],
    runs: Sequence[Mapping[str, Any]],
    summary: Sequence[Mapping[str, Any]],
    capacity: Mapping[str, Any] | None = None,
) -> None:
    """Deterministic: same inputs give byte-identical files (sorted keys, no timestamps).
    ``capacity``: workload name -> its measured knee, ceiling and offered rate."""
    document = {
        "config": config, "runs": list(runs), "summary": list(summary),
        "capacity": dict(capacity or {}),
    }  # fmt: skip
    path.write_text(json.dumps(_finite(document), indent=1, sort_keys=True) + "\n")


def _fmt(value: float | None) -> str:
    return "" if value is None else repr(round(value, 6))


def _times(times_s: Sequence[float]) -> str:
    """Token times rounded to the microsecond, space-separated (vectorised: a bench writes
    millions of them)."""
    if not times_s:
        return ""
    return " ".join(map(repr, np.round(np.asarray(times_s, dtype=float), 6).tolist()))


def write_requests_csv(path: Path, results: Sequence[CellResult]) -> None:
    """One row per request of every run; token times (s) space-separated."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUEST_COLUMNS)
        for result in results:
            run = result.run
            for r in result.requests:
                writer.writerow(
                    (
                        run["scheduler"], run["workload"], run["engine"], run["seed"],
                        r.request_id, _fmt(r.arrival_s), _fmt(r.admitted_s),
                        _fmt(r.token_times_s[0] if r.token_times_s else None),
                        _fmt(r.finished_s), r.num_prompt_tokens, r.max_tokens,
                        r.num_output_tokens, r.num_preemptions, r.num_recomputed_tokens,
                        "" if r.container_id is None else r.container_id,
                        _fmt(r.cold_start_s), r.status.value,
                        _times(r.token_times_s),
                    )
                )  # fmt: skip

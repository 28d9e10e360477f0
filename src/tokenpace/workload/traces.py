"""Trace replay: Azure LLM inference traces (2023/2024) and BurstGPT, as request specs.

Azure: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
``2023-11-16 18:15:46.6805900`` (7 fractional digits, which ``datetime`` cannot parse, so the
fraction is split off; an optional UTC offset is accepted), CRLF line ends, the last line
possibly without one. BurstGPT: ``Timestamp,Model,Request tokens,Response tokens,Total
tokens,Log Type`` with timestamps in seconds; rows with 0 response tokens are failed requests
and are skipped (and counted), as are rows with 0 prompt tokens in either format.

Arrivals are seconds after the first row of the window, divided by ``time_scale``.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tokenpace.core.config import option, require_positive
from tokenpace.core.registry import Registry
from tokenpace.workload.spec import RequestSpec

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_HEADER = (
    "Timestamp",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
)
_AZURE_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?"
)


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to cut and pace a trace."""

    time_scale: float = option(1.0, "Speed-up factor: arrival gaps are divided by it.")
    start_s: float = option(0.0, "Window start, seconds after the trace's first row.")
    end_s: float | None = option(None, "Window end (exclusive), seconds after the first row.")
    max_requests: int | None = option(None, "Keep at most this many requests of the window.")

    def __post_init__(self) -> None:
        require_positive(self, "time_scale")
        if self.start_s < 0:
            raise ValueError(f"TraceOptions.start_s must be >= 0, got {self.start_s}")
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(
                f"TraceOptions.end_s ({self.end_s}) must exceed start_s ({self.start_s})"
            )
        if self.max_requests is not None and self.max_requests <= 0:
            raise ValueError(f"TraceOptions.max_requests must be > 0, got {self.max_requests}")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One parsed row: absolute time in seconds (any origin), token counts."""

    line_number: int
    time_s: float
    num_prompt_tokens: int
    num_output_tokens: int


@dataclass(frozen=True, slots=True)
class ParseReport:
    """What reading a trace did: data rows read, skipped as failed (0 tokens), outside the
    window or past ``max_requests``, and kept."""

    path: str
    trace_format: str
    num_rows: int
    num_failed: int
    num_outside_window: int
    num_kept: int
    span_s: float


@dataclass(frozen=True, slots=True)
class Trace:
    """Request specs of a replay plus the parse report."""

    specs: list[RequestSpec]
    report: ParseReport

    @property
    def mean_rate_per_s(self) -> float:
        """Requests per second over the replayed span (0 for fewer than two requests)."""
        if len(self.specs) < 2:
            return 0.0
        return (len(self.specs) - 1) / (self.specs[-1].arrival_s - self.specs[0].arrival_s)


TraceReader = Callable[[Path], Iterator[TraceRow | None]]
TRACE_FORMATS: Registry[TraceReader] = Registry("trace format")


def _rows(
    path: Path, header: tuple[str, ...], parse: Callable[[list[str], int], TraceRow | None]
) -> Iterator[TraceRow | None]:
    """Parsed rows (None for a failed request); ValueError names ``path:line`` on any
    malformed row."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        first = next(reader, None)
        if first is None or tuple(c.strip() for c in first) != header:
            raise ValueError(f"{path}:1: expected header {','.join(header)}, got {first}")
        for record in reader:
            line = reader.line_num
            if not record or record == [""]:
                continue
            if len(record) != len(header):
                raise ValueError(
                    f"{path}:{line}: expected {len(header)} columns, got {len(record)}"
                )
            try:
                yield parse(record, line)
            except ValueError as error:
                raise ValueError(f"{path}:{line}: {error}") from None


def _count(text: str, column: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{column} {text!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{column} {value} is negative")
    return value


def parse_azure_timestamp(text: str) -> float:
    """Seconds since the epoch (UTC unless an offset is given) of an Azure timestamp, with
    any number of fractional digits up to 9."""
    match = _AZURE_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'")
    whole, fraction, offset = match.groups()
    stamp = datetime.fromisoformat(whole)
    if offset:
        stamp = datetime.fromisoformat(whole + ("+00:00" if offset == "Z" else offset))
    else:
        stamp = stamp.replace(tzinfo=UTC)
    seconds = stamp.timestamp()
    if fraction:
        seconds += int(fraction) / 10 ** len(fraction)
    return seconds


def _azure_row(record: list[str], line: int) -> TraceRow | None:
    prompt = _count(record[1], "ContextTokens")
    output = _count(record[2], "GeneratedTokens")
    time_s = parse_azure_timestamp(record[0])
    if prompt == 0 or output == 0:
        return None
    return TraceRow(line, time_s, prompt, output)


def _burstgpt_row(record: list[str], line: int) -> TraceRow | None:
    try:
        time_s = float(record[0])
    except ValueError:
        raise ValueError(f"Timestamp {record[0]!r} is not a number") from None
    prompt = _count(record[2], "Request tokens")
    output = _count(record[3], "Response tokens")
    if prompt == 0 or output == 0:
        return None
    return TraceRow(line, time_s, prompt, output)


@TRACE_FORMATS.register("azure")
def read_azure(path: Path) -> Iterator[TraceRow | None]:
    """Rows of an Azure LLM inference trace (None for a row with a zero token count)."""
    return _rows(path, AZURE_HEADER, _azure_row)


@TRACE_FORMATS.register("burstgpt")
def read_burstgpt(path: Path) -> Iterator[TraceRow | None]:
    """Rows of a BurstGPT trace (None for a failed request: 0 response tokens)."""
    return _rows(path, BURSTGPT_HEADER, _burstgpt_row)


def load_trace(path: Path, trace_format: str, options: TraceOptions | None = None) -> Trace:
    """Read ``path`` in ``trace_format`` (``azure`` or ``burstgpt``) and cut it to the
    window of ``options``. Rows are replayed in time order (a stable sort, so equal times
    keep file order). Raises FileNotFoundError for a missing file and ValueError naming the
    file and line of the first malformed row."""
    options = options or TraceOptions()
    reader = TRACE_FORMATS.get(trace_format)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {str(path)!r} does not exist")
    num_rows = 0
    num_failed = 0
    rows: list[TraceRow] = []
    for row in reader(path):
        num_rows += 1
        if row is None:
            num_failed += 1
        else:
            rows.append(row)
    rows.sort(key=lambda r: r.time_s)
    origin = rows[0].time_s if rows else 0.0
    end = float("inf") if options.end_s is None else options.end_s
    window = [r for r in rows if options.start_s <= r.time_s - origin < end]
    if options.max_requests is not None:
        window = window[: options.max_requests]
    first = window[0].time_s if window else 0.0
    specs = [
        RequestSpec(
            arrival_s=(r.time_s - first) / options.time_scale,
            num_prompt_tokens=r.num_prompt_tokens,
            max_tokens=r.num_output_tokens,
        )
        for r in window
    ]
    report = ParseReport(
        path=str(path),
        trace_format=trace_format,
        num_rows=num_rows,
        num_failed=num_failed,
        num_outside_window=len(rows) - len(window),
        num_kept=len(window),
        span_s=specs[-1].arrival_s if specs else 0.0,
    )
    return Trace(specs, report)


def time_scale_for_rate(trace: Trace, target_rate_per_s: float) -> float:
    """The ``time_scale`` that replays ``trace`` (read at scale 1) at ``target_rate_per_s``
    requests/s on average."""
    if not target_rate_per_s > 0:
        raise ValueError(f"target_rate_per_s must be > 0, got {target_rate_per_s}")
    rate = trace.mean_rate_per_s
    if rate <= 0:
        raise ValueError(f"{trace.report.path}: too few requests to measure a rate")
    return target_rate_per_s / rate

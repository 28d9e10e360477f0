from __future__ import annotations

from pathlib import Path

import pytest

from tokenpace.workload.traces import (
    TraceOptions,
    load_trace,
    parse_azure_timestamp,
    time_scale_for_rate,
)

AZURE_FILE = Path("/work/shared/data/AzureLLMInferenceTrace_conv.csv")
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def write(tmp_path: Path, name: str, lines: list[str], end: str = "\r\n") -> Path:
    path = tmp_path / name
    path.write_bytes(end.join(lines).encode())  # no newline after the last line
    return path


def test_azure_seven_digit_fractions_crlf_and_no_final_newline(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "azure.csv",
        [
            AZURE_HEADER,
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109",
            "2023-11-16 18:15:51.2224670,879,55",
        ],
    )
    trace = load_trace(path, "azure")
    assert [s.num_prompt_tokens for s in trace.specs] == [374, 396, 879]
    assert [s.max_tokens for s in trace.specs] == [44, 109, 55]
    assert trace.specs[0].arrival_s == 0.0
    assert trace.specs[1].arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert trace.specs[2].arrival_s == pytest.approx(4.541877, abs=1e-6)
    assert (trace.report.num_rows, trace.report.num_kept, trace.report.num_failed) == (3, 3, 0)


def test_azure_timestamp_variants() -> None:
    base = parse_azure_timestamp("2024-05-10 00:00:00")
    assert parse_azure_timestamp("2024-05-10 00:00:00.5") - base == pytest.approx(0.5)
    assert parse_azure_timestamp("2024-05-10 00:00:01.000000+00:00") - base == pytest.approx(1)
    with pytest.raises(ValueError, match="TIMESTAMP"):
        parse_azure_timestamp("16/11/2023 18:15")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2023-11-16 18:15:50.9951690,abc,109", "ContextTokens 'abc' is not an integer"),
        ("2023-11-16 18:15:50.9951690,396", "expected 3 columns, got 2"),
        ("yesterday,396,109", "TIMESTAMP 'yesterday'"),
        ("2023-11-16 18:15:50.9951690,396,-4", "GeneratedTokens -4 is negative"),
    ],
)
def test_azure_malformed_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path, "bad.csv", [AZURE_HEADER, "2023-11-16 18:15:46.6805900,374,44", row])
    with pytest.raises(ValueError, match=f"bad.csv:3: {message}"):
        load_trace(path, "azure")


def test_wrong_header_is_line_one(tmp_path: Path) -> None:
    path = write(tmp_path, "h.csv", ["time,in,out", "1,2,3"])
    with pytest.raises(ValueError, match=r"h\.csv:1: expected header"):
        load_trace(path, "azure")


def test_burstgpt_skips_and_counts_failed_requests(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "burst.csv",
        [
            BURSTGPT_HEADER,
            "5,ChatGPT,472,18,490,Conversation log",
            "45,ChatGPT,1087,0,1087,Conversation log",
            "118,GPT-4,417,276,693,API log",
        ],
        end="\n",
    )
    trace = load_trace(path, "burstgpt")
    assert [(s.arrival_s, s.num_prompt_tokens, s.max_tokens) for s in trace.specs] == [
        (0.0, 472, 18),
        (113.0, 417, 276),
    ]
    assert (trace.report.num_rows, trace.report.num_failed, trace.report.num_kept) == (3, 1, 2)


def test_burstgpt_malformed_row(tmp_path: Path) -> None:
    path = write(tmp_path, "b.csv", [BURSTGPT_HEADER, "5,ChatGPT,x,18,490,Conversation log"])
    with pytest.raises(ValueError, match=r"b\.csv:2: Request tokens 'x'"):
        load_trace(path, "burstgpt")


def test_window_and_time_scale(tmp_path: Path) -> None:
    rows = [f"{t},M,10,5,15,API log" for t in (0, 10, 20, 30, 40)]
    path = write(tmp_path, "w.csv", [BURSTGPT_HEADER, *rows])
    options = TraceOptions(time_scale=2.0, start_s=10.0, end_s=40.0, max_requests=2)
    trace = load_trace(path, "burstgpt", options)
    assert [s.arrival_s for s in trace.specs] == [0.0, 5.0]
    assert trace.report.num_outside_window == 3
    with pytest.raises(ValueError, match="end_s"):
        TraceOptions(start_s=5.0, end_s=5.0)
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.csv", "azure")


@pytest.mark.skipif(not AZURE_FILE.is_file(), reason="Azure trace not present")
def test_real_azure_conversation_trace() -> None:
    head = load_trace(AZURE_FILE, "azure", TraceOptions(max_requests=3))
    assert [(s.num_prompt_tokens, s.max_tokens) for s in head.specs] == [
        (374, 44),
        (396, 109),
        (879, 55),
    ]
    full = load_trace(AZURE_FILE, "azure")
    assert full.report.num_rows == 19366 and full.report.num_failed == 0
    assert full.report.span_s == pytest.approx(3501.72, abs=0.01)
    assert full.mean_rate_per_s == pytest.approx(5.53, abs=0.01)
    scale = time_scale_for_rate(full, 11.06)
    assert scale == pytest.approx(2.0, rel=1e-3)

"""`tokenpace bench` end to end, and its one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def capacity_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One capacity cache for the module's bench runs (each knee is measured once)."""
    cache = tmp_path_factory.mktemp("capacity-cache")
    saved = os.environ.get("TOKENPACE_CACHE_DIR")
    os.environ["TOKENPACE_CACHE_DIR"] = str(cache)
    yield
    if saved is None:
        del os.environ["TOKENPACE_CACHE_DIR"]
    else:
        os.environ["TOKENPACE_CACHE_DIR"] = saved


def tokenpace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenpace.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--schedulers", "twp,nope"], "--schedulers 'nope' is not a valid choice; valid"),
        (["--seeds", "0"], "--seeds must be > 0, got 0"),
        (["--slo-ttft-ms", "-5"], "--slo-ttft-ms must be > 0, got -5.0"),
        (["--profile", "missing.json"], "profile file 'missing.json' does not exist"),
        (["--profile", "nosuch"], "no profile named 'nosuch'; shipped: v100-llama-3.2-3b"),
        (["--prompts", "missing.jsonl"], "prompts file 'missing.jsonl' does not exist"),
    ],
)  # fmt: skip
def test_bad_input_gets_one_line_error_and_exit_2(args: list[str], message: str) -> None:
    result = tokenpace("bench", *args)
    assert result.returncode == 2
    assert result.stderr.startswith("tokenpace bench: error: ")
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bench_runs_and_prints_table(tmp_path: Path) -> None:
    result = tokenpace("bench", "--schedulers", "twp,fcfs", "--seeds", "2", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "twp" in result.stdout and "fcfs" in result.stdout
    document = json.loads((tmp_path / "results.json").read_text())
    assert {r["scheduler"] for r in document["runs"]} == {"twp", "fcfs"}
    assert (tmp_path / "report.md").exists() and (tmp_path / "requests.csv").exists()
    # Standard error is a pipe here, where no progress bar draws: a line per finished run.
    finished = re.findall(r"^run (\d+)/4 done: (\w+) on main, seed (\d)", result.stderr, re.M)
    assert [int(n) for n, _, _ in finished] == [1, 2, 3, 4]
    assert sorted((name, int(seed)) for _, name, seed in finished) == [
        ("fcfs", 0),
        ("fcfs", 1),
        ("twp", 0),
        ("twp", 1),
    ]


def test_whole_evaluation_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    args = ("bench", "--preset", "all", "--schedulers", "twp,serverlessllm", "--seeds", "1",
            "--scenario-duration", "3")  # fmt: skip
    first = tokenpace(*args, "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    assert tokenpace(*args, "--out", str(tmp_path / "b")).returncode == 0
    a = (tmp_path / "a" / "results.json").read_bytes()
    assert a == (tmp_path / "b" / "results.json").read_bytes()
    document = json.loads(a)
    workloads = {(r["workload"], r["scheduler"]) for r in document["runs"]}
    # The single-server main experiment has no router, so serverlessllm runs only on the pool.
    assert ("main", "twp") in workloads and ("main", "serverlessllm") not in workloads
    assert {("high", "serverlessllm"), ("burst", "twp")} <= workloads
    pool_runs = [r for r in document["runs"] if r["workload"] != "main"]
    assert all("num_cold_starts" in r and "container_seconds" in r for r in pool_runs)
    assert {("kv_pressure", "twp"), ("prefill_heavy", "serverlessllm")} <= workloads
    names = ("main", "low", "medium", "high", "burst", "kv_pressure", "prefill_heavy")
    assert set(document["capacity"]) == set(names)
    for name in names:
        entry = document["capacity"][name]
        # (A 3 s window absorbs transient overload: its knee may pass the steady ceiling.)
        assert entry["knee_rps"] > 0 and entry["ceiling_rps"] > 0
    high = document["capacity"]["high"]
    assert high["rate_rps"] == pytest.approx(1.2 * high["knee_rps"])
    report = (tmp_path / "a" / "report.md").read_text()
    assert "Cold starts" in report and "## Capacity" in report


AZURE_ROWS = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2224670,879,55"
)


def test_trace_replay_on_the_pool(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(AZURE_ROWS, newline="")
    result = tokenpace("bench", "--trace", str(trace), "--schedulers", "twp,fcfs",
                       "--out", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["n_completed"] for r in document["runs"]] == [3, 3]
    assert "3 replayed" in (tmp_path / "out" / "report.md").read_text()


def test_malformed_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text(AZURE_ROWS.replace("396,109", "396,lots"), newline="")
    result = tokenpace("bench", "--trace", str(trace))
    assert result.returncode == 2
    assert "bad.csv:3" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    unknown = tokenpace("bench", "--trace", str(trace), "--trace-format", "csv")
    assert unknown.returncode == 2
    assert "--trace-format 'csv' is not a valid choice; valid choices: azure, burstgpt" in (
        unknown.stderr
    )


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``tokenpace ARGS`` in this process: (exit status, stdout, stderr)."""
    from tokenpace.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def command_names() -> list[str]:
    from tokenpace.cli.commands import COMMANDS

    return COMMANDS.names()


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    for name in ("bench", "profile", "serve", "version"):
        assert f"  {name} " in out
    code, _, err = run_main(capsys, "benchh")
    assert code == 2
    valid = "bench, profile, serve, version"
    assert err == f"tokenpace: error: unknown command 'benchh'; valid choices: {valid}\n"


@pytest.mark.parametrize("command", ["bench", "profile", "serve", "version"])
def test_help_lists_every_choice_from_the_registries(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenpace.cli.commands import COMMANDS
    from tokenpace.cli.spec import flag_specs

    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    assert "--config FILE" in out and "--dump-config" in out
    help_text = " ".join(out.split())
    for spec in flag_specs(COMMANDS.get(command).config_cls):
        assert spec.flag in out
        if spec.choices is not None:
            assert f"Choices: {', '.join(spec.choices)}." in help_text, spec.flag
        # A default is printed once at most.
        entry = re.split(rf" {re.escape(spec.flag)}[ ,]", help_text, maxsplit=1)[1]
        entry = entry.split(" --", 1)[0]
        assert entry.lower().count("(default") <= 1, spec.flag


def test_choice_lists_come_from_the_registries(capsys: pytest.CaptureFixture[str]) -> None:
    from tokenpace.bench.presets import PRESETS
    from tokenpace.engine.dtype import DTYPE_CHOICES
    from tokenpace.engine.profile import shipped_profiles
    from tokenpace.policy import POLICIES
    from tokenpace.pool.router import ROUTERS
    from tokenpace.server.options import ENGINES
    from tokenpace.workload.traces import TRACE_FORMATS

    helps = {c: " ".join(run_main(capsys, c, "--help")[1].split()) for c in command_names()}
    expected = {
        "bench": [*PRESETS.names(), *POLICIES.names(), *ROUTERS.names(), *TRACE_FORMATS.names(),
                  "sim", "native", "vllm", *shipped_profiles()],
        "serve": [*POLICIES.names(), *ROUTERS.names(), *ENGINES, *DTYPE_CHOICES, "warning"],
        "profile": ["native", "vllm", *DTYPE_CHOICES],
    }  # fmt: skip
    for command, names in expected.items():
        for name in names:
            assert name in helps[command], (command, name)


def test_a_new_registry_entry_appears_without_editing_the_config(
    tmp_path: Path,
) -> None:
    from dataclasses import dataclass

    from tokenpace.cli.command import build_parser, parse_config
    from tokenpace.cli.spec import UsageError, flag_specs
    from tokenpace.core.config import option
    from tokenpace.core.registry import Registry

    kinds: Registry[int] = Registry("kind")
    kinds.register("a")(1)

    @dataclass(frozen=True, slots=True)
    class Settings:
        kind: str = option("a", "A kind.", choices=kinds.names)

    with pytest.raises(UsageError, match=r"--kind 'b' is not a valid choice; valid choices: a$"):
        parse_config(Settings, ["--kind", "b"], prog="p")
    kinds.register("b")(2)
    assert parse_config(Settings, ["--kind", "b"], prog="p").config == Settings("b")
    help_text = build_parser(flag_specs(Settings), "p", None).format_help()
    assert "Choices: a, b." in help_text


def test_flag_names_aliases_and_required_fields() -> None:
    from dataclasses import dataclass, field

    from tokenpace.cli.command import build_parser, parse_config
    from tokenpace.cli.spec import UsageError, flag_specs
    from tokenpace.core.config import option

    @dataclass(frozen=True, slots=True)
    class Settings:
        name: str = field(metadata={"help": "A name."})
        log_level: str = option("info", "Level.", flag="--uvicorn-log-level", aliases=("--ll",))
        sizes: tuple[int, ...] = option((1, 2), "Sizes.")

    with pytest.raises(UsageError, match=r"^--name is required$"):
        parse_config(Settings, [], prog="p")
    parsed = parse_config(Settings, ["--name", "x", "--ll", "debug", "--sizes", "3,4"], prog="p")
    assert parsed.config == Settings("x", "debug", (3, 4))
    help_text = build_parser(flag_specs(Settings), "p", None).format_help()
    assert "--uvicorn-log-level" in help_text and "--ll" not in help_text
    assert "(required)" in help_text and "(default: 1,2)" in help_text
    with pytest.raises(UsageError, match=r"^--sizes '3x' is not an integer$"):
        parse_config(Settings, ["--name", "x", "--sizes", "3x"], prog="p")


BENCH_SCRIPTS = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "choice"),
    [
        ("engine_throughput.py", "Choices: float32, bfloat16, float16."),
        ("reliability.py", "--server-args TEXT"),
        ("scheduler_overhead.py", "--num-iters N"),
        ("serve_load.py", "Choices: native, vllm."),
        ("sim_speed.py", "Choices: dynamic_batch, fcfs,"),
    ],
)
def test_bench_scripts_share_the_mechanism(script: str, choice: str, tmp_path: Path) -> None:
    path = BENCH_SCRIPTS / script
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    shown = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert "--config FILE" in shown.stdout and choice in " ".join(shown.stdout.split())
    (tmp_path / "bad.yaml").write_text("nope: 1\n")
    bad = subprocess.run(
        [sys.executable, str(path), "--config", str(tmp_path / "bad.yaml")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.startswith(f"bench/{script}: error: --config ")
    assert "unknown key 'nope'" in bad.stderr


@pytest.mark.parametrize(
    ("command", "args", "named"),
    [
        ("bench", ["--preset", "nope"], "--preset 'nope' is not a valid choice; valid choices: "),
        ("bench", ["--router", "nope"], "--router 'nope' is not a valid choice; valid choices: "),
        ("bench", ["--engine", "tgi"], "--engine 'tgi' is not a valid choice; valid choices: "),
        ("bench", ["--seeds", "many"], "--seeds 'many' is not an integer"),
        ("bench", ["--keep-alive", "0"], "--keep-alive must be > 0, got 0.0"),
        ("bench", ["--profile-max-age-h", "-1"], "--profile-max-age-h must be >= 0, got -1.0"),
        ("bench", ["--fidelity"], "--fidelity compares a real engine with the simulator"),
        ("bench", ["--nope"], "unrecognized arguments: --nope"),
        ("profile", ["--engine", "sim"], "--engine 'sim' is not a valid choice; valid choices: "),
        ("profile", ["--dtype", "int4"], "--dtype 'int4' is not a valid choice; valid choices: "),
        ("profile", ["--max-sweeps", "0"], "--max-sweeps must be at least 1, got 0"),
        ("serve", ["--scheduler", "nope"], "--scheduler 'nope' is not a valid choice"),
        ("serve", ["--dtype", "fp8"], "--dtype 'fp8' is not a valid choice; valid choices: "),
        ("serve", ["--uvicorn-log-level", "loud"], "--uvicorn-log-level 'loud' is not a valid"),
        ("serve", ["--port", "http"], "--port 'http' is not an integer"),
        ("serve", ["--max-num-seqs", "0"], "--max-num-seqs must be > 0, got 0"),
        ("version", ["--verbose"], "unrecognized arguments: --verbose"),
    ],
)
def test_every_command_has_one_error_format(
    command: str, args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_main(capsys, command, *args)
    assert code == 2 and not out
    assert err.startswith(f"tokenpace {command}: error: {named}")
    assert err.count("\n") == 1


CONFIG_CHANGES = {
    "bench": ["--schedulers", "twp,fcfs", "--seeds", "3", "--keep-alive", "5",
              "--trace-end", "60", "--out", "elsewhere", "--fidelity", "--engine", "native"],
    "profile": ["--engine", "vllm", "--dtype", "bfloat16", "--skip-checkpoints"],
    "serve": ["--port", "9000", "--scheduler", "fcfs", "--keep-alive", "5",
              "--uvicorn-log-level", "warning", "--api-key", "1234", "--cache-dir", "/tmp/c"],
    "version": [],
}  # fmt: skip


@pytest.mark.parametrize("command", ["bench", "profile", "serve", "version"])
def test_config_file_round_trips(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenpace.cli.command import parse_config
    from tokenpace.cli.commands import COMMANDS

    config_cls = COMMANDS.get(command).config_cls
    code, dumped, err = run_main(capsys, command, *CONFIG_CHANGES[command], "--dump-config")
    assert code == 0, err
    path = tmp_path / "settings.yaml"
    path.write_text(dumped)
    code, again, err = run_main(capsys, command, "--config", str(path), "--dump-config")
    assert code == 0, err
    assert again == dumped
    from_flags = parse_config(config_cls, CONFIG_CHANGES[command], prog="t").config
    from_file = parse_config(config_cls, ["--config", str(path)], prog="t").config
    assert from_file == from_flags
    if CONFIG_CHANGES[command]:
        assert from_file != config_cls()


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    from tokenpace.cli.command import parse_config
    from tokenpace.server.options import ServeOptions

    path = tmp_path / "serve.yaml"
    path.write_text("port: 9000\nmax_num_seqs: 16\nkeep-alive: 3\nscheduler: fcfs\n")
    options = parse_config(ServeOptions, ["--config", str(path), "--port", "9001"], prog="t")
    assert options.config == ServeOptions(
        port=9001, max_num_seqs=16, keep_alive_s=3.0, scheduler="fcfs"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("seeds: 2\nmax-seqs: 4\n", "unknown key 'max-seqs'; valid keys: preset, schedulers,"),
        ("seeds: two\n", "--seeds 'two' is not an integer"),
        ("engine: tgi\n", "--engine 'tgi' is not a valid choice; valid choices: native, sim"),
        ("fidelity: 1\n", "--fidelity 1 is not true or false"),
        ("- seeds\n", "must hold a mapping of flag names to values"),
        ("seeds: [\n", "is not valid YAML"),
        ("seeds: 0\n", "--seeds must be > 0, got 0"),
    ],
)
def test_bad_config_file_names_the_key(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bench.yaml"
    path.write_text(text)
    code, _, err = run_main(capsys, "bench", "--config", str(path))
    assert code == 2
    assert err.startswith("tokenpace bench: error: ") and message in err
    assert err.count("\n") == 1
    missing = run_main(capsys, "bench", "--config", str(tmp_path / "none.yaml"))
    assert missing[0] == 2 and "none.yaml" in missing[2]

"""Load test of ``tokenpace serve``: TWP vs FCFS at the same open-loop load on loopback.

For each scheduler a server process is started (embedded SmolLM2, a bounded admission
queue). Capacity is measured once, on the first scheduler, as completed requests/s of a
closed loop of ``--concurrency`` streaming clients; then every scheduler receives the same
seeded Poisson arrival sequence at ``--load-factor`` x that capacity for ``--duration``
seconds. Each request streams ``max_tokens`` tokens (EOS ignored, lengths drawn uniformly
from ``--min-tokens``..``--max-tokens``). Reported per scheduler: counts of 200 / 429 /
5xx / other, accepted requests that completed, p50/p99 TTFT and ITL (ms) of accepted
requests measured at the client, and the server's abort counter. ``--soak N`` afterwards
sends N more short requests to the last server and reports its resident memory and KV
blocks before and after (server plus engine worker processes). ``--engine`` and
``--containers`` choose the engine and the pool size. Prints one JSON object on its last
line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.policy import POLICIES
from tokenpace.server.options import ENGINES

MODEL = "smollm2-135m-instruct"
PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "List some facts about the moon.",
    "Describe a walk through a busy market in the morning.",
    "What makes a good cup of tea? Answer in detail.",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of this benchmark."""

    schedulers: tuple[str, ...] = option(
        ("twp", "fcfs"), "Schedulers to compare, one server each.", choices=POLICIES.names
    )
    duration: float = option(60.0, "Open-loop seconds.")
    load_factor: float = option(2.0, "Arrival rate as a multiple of the measured capacity.")
    request_rate: float | None = option(
        None, "Fixed arrival rate (req/s) instead of --load-factor x capacity."
    )
    capacity_seconds: float = option(20.0, "Seconds of the closed loop measuring capacity.")
    concurrency: int = option(8, "Closed-loop clients measuring capacity (and soaking).")
    min_tokens: int = option(8, "Shortest output (tokens).")
    max_tokens: int = option(64, "Longest output (tokens).")
    max_queued_requests: int = option(16, "The server's admission queue bound.")
    soak: int = option(0, "Soak requests sent to the last server after the runs.")
    seed: int = option(0, "Seed of the arrival sequence.")
    engine: str = option("native", "Engine of the servers.", choices=ENGINES)
    containers: int = option(1, "Pool size (all warm).")
    server_args: str = option("", "More `tokenpace serve` flags, e.g. '--slo-tpot-ms 250'.")

    def __post_init__(self) -> None:
        require_positive(
            self, "duration", "load_factor", "capacity_seconds", "concurrency", "min_tokens",
            "containers",
        )  # fmt: skip
        if self.request_rate is not None and not self.request_rate > 0:
            raise ValueError(f"Settings.request_rate must be > 0, got {self.request_rate}")
        if self.max_tokens < self.min_tokens:
            raise ValueError(f"Settings.max_tokens must be >= --min-tokens, got {self.max_tokens}")


@dataclass
class Outcome:
    status: int
    completed: bool = False
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(scheduler: str, port: int, args: Settings) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    command = [
        sys.executable,
        "-m",
        "tokenpace.server",
        "--port",
        str(port),
        "--scheduler",
        scheduler,
        "--max-queued-requests",
        str(args.max_queued_requests),
        "--engine",
        args.engine,
        "--containers",
        str(args.containers),
        "--warm-containers",
        str(args.containers),
        *shlex.split(args.server_args),
        "--uvicorn-log-level",
        "warning",
    ]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"server for {scheduler} exited with {process.returncode}")
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"server for {scheduler} did not start")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


async def one_request(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> Outcome:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            outcome = Outcome(response.status_code)
            if response.status_code != 200:
                await response.aread()
                return outcome
            last: float | None = None
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    break
                data = json.loads(payload)
                if "error" in data:
                    outcome.status = 500
                    return outcome
                choice = data["choices"][0]
                now = time.perf_counter()
                if choice["text"]:
                    if last is None:
                        outcome.ttft_s = now - start
                    else:
                        outcome.gaps_s.append(now - last)
                    last = now
                if choice["finish_reason"] is not None:
                    outcome.completed = choice["finish_reason"] in ("length", "stop")
            return outcome
    except httpx.HTTPError:
        return Outcome(599)


async def closed_loop(url: str, concurrency: int, duration_s: float) -> float:
    """Completed requests/s of ``concurrency`` clients sending back to back."""
    rng = np.random.default_rng(1)
    done = 0
    end = time.perf_counter() + duration_s
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                outcome = await one_request(client, str(rng.choice(PROMPTS)), 32)
                done += outcome.completed

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


async def open_loop(url: str, arrivals: list[tuple[float, str, int]]) -> list[Outcome]:
    async with httpx.AsyncClient(
        base_url=url, timeout=600, limits=httpx.Limits(max_connections=None)
    ) as client:
        start = time.perf_counter()
        tasks = []
        for at, prompt, max_tokens in arrivals:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_request(client, prompt, max_tokens)))
        return list(await asyncio.gather(*tasks))


def percentile_ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if values else None


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    accepted = [o for o in outcomes if o.status == 200]
    ttfts = [o.ttft_s for o in accepted if o.ttft_s is not None]
    gaps = [g for o in accepted for g in o.gaps_s]
    return {
        "n_sent": len(outcomes),
        "n_200": len(accepted),
        "n_429": sum(o.status == 429 for o in outcomes),
        "n_5xx": sum(500 <= o.status < 600 for o in outcomes),
        "n_other": sum(o.status not in (200, 429) and not 500 <= o.status < 600 for o in outcomes),
        "n_accepted_completed": sum(o.completed for o in accepted),
        "ttft_ms": {"p50": percentile_ms(ttfts, 50), "p99": percentile_ms(ttfts, 99)},
        "itl_ms": {"p50": percentile_ms(gaps, 50), "p99": percentile_ms(gaps, 99)},
    }


def server_metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    return sum(float(m.group(2)) for line in text.splitlines() if (m := pattern.match(line)))


def engine_pids(url: str) -> list[int]:
    containers = httpx.get(f"{url}/health").json()["containers"]
    return [int(c["pid"]) for c in containers if c["pid"] is not None]


def total_rss_mb(server_pid: int, url: str) -> float:
    """Resident memory of the server process and every engine worker process."""
    return rss_mb(server_pid) + sum(rss_mb(pid) for pid in engine_pids(url))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def soak(url: str, num_requests: int, concurrency: int) -> int:
    """Send ``num_requests`` short requests with ``concurrency`` clients; return the number
    that completed."""
    done = 0
    counter = iter(range(num_requests))
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def worker() -> None:
            nonlocal done
            for i in counter:
                outcome = await one_request(client, PROMPTS[i % len(PROMPTS)], 4)
                done += outcome.completed

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/serve_load.py", description=__doc__)


def run(args: Settings) -> None:
    schedulers = list(args.schedulers)
    result: dict[str, Any] = {"config": asdict(args), "runs": {}}
    rate = args.request_rate
    for index, scheduler in enumerate(schedulers):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start_server(scheduler, port, args)
        try:
            if rate is None:
                capacity = asyncio.run(closed_loop(url, args.concurrency, args.capacity_seconds))
                result["capacity_rps"] = round(capacity, 3)
                rate = args.load_factor * capacity
                result["rate_rps"] = round(rate, 3)
            rng = np.random.default_rng(args.seed)
            arrivals: list[tuple[float, str, int]] = []
            at = float(rng.exponential(1 / rate))
            while at < args.duration:
                tokens = int(rng.integers(args.min_tokens, args.max_tokens + 1))
                arrivals.append((at, str(rng.choice(PROMPTS)), tokens))
                at += float(rng.exponential(1 / rate))
            outcomes = asyncio.run(open_loop(url, arrivals))
            run = summarize(outcomes)
            run["server_aborts"] = server_metric(url, "tokenpace:request_aborts_total")
            run["server_kv_used_blocks_after"] = server_metric(
                url, "tokenpace:kv_cache_used_blocks"
            )
            result["runs"][scheduler] = run
            print(scheduler, json.dumps(run), file=sys.stderr)
            if args.soak and index == len(schedulers) - 1:
                before = total_rss_mb(process.pid, url)
                pids_before = engine_pids(url)
                completed = asyncio.run(soak(url, args.soak, args.concurrency))
                time.sleep(1.0)
                result["soak"] = {
                    "n_requests": args.soak,
                    "n_completed": completed,
                    "rss_mb_before": round(before, 1),
                    "rss_mb_after": round(total_rss_mb(process.pid, url), 1),
                    "engine_pids_unchanged": engine_pids(url) == pids_before,
                    "kv_used_blocks_after": server_metric(url, "tokenpace:kv_cache_used_blocks"),
                    "num_running_after": server_metric(url, "tokenpace:num_requests_running"),
                }
        finally:
            stop_server(process)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

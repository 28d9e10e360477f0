"""Reliability of ``tokenpace serve`` in one bounded run on loopback: the figures an
operator asks for, measured, one JSON object on the last stdout line.

One server (native engine, ``--containers 2``, both warm, default flags otherwise) goes
through, in order:

- capacity: completed requests/s of a closed loop of ``--concurrency`` streaming clients
  (32 output tokens each; enough clients to keep both containers at their B0);
- overload: Poisson arrivals at ``--load-factor`` x capacity for ``--overload-s`` seconds
  (admission queue ``--max-queued-requests``): accepted, completed, 429 (and how many
  carried Retry-After), 5xx (an in-stream error or a broken connection counts as one), p99
  TTFT of accepted;
- disconnects: ``--disconnect-clients`` streams dropped after their first token (a client
  refused with a 429 retries after Retry-After): seconds from the last hang-up until running
  requests and KV blocks are back to the idle baseline, and that time in decode steps (the
  server's mean inter-token latency);
- hostile input: schemathesis over the OpenAPI document (``--fuzz-examples`` per
  operation) and a list of hostile bodies: every answer 4xx with a message, 0 5xx,
  server still healthy;
- soak: ``--soak-requests`` short requests (stopped at ``--soak-max-s``): resident memory
  of server and engines, and KV blocks, before and after;
- kill -9 of the engine worker running streams: streams resumed on the other container,
  streams failed, the longest token gap across the kill;
- SIGTERM during load: accepted streams that still end with ``[DONE]``.

Then the kill -9 check runs again on a server whose containers are Ray actors
(``--ray-address local``, one CPU and one thread per engine actor so both fit a local
cluster on two cores, with the precision ``--dtype auto`` chose on the first server),
unless ``--skip-ray``. The issue's figures are 5 minutes of
overload and 5,000 soak requests; the defaults are scaled down so the whole run stays
near ten minutes on a 2-core machine, and the JSON states both.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import httpx
import numpy as np

from serve_load import (
    MODEL,
    PROMPTS,
    closed_loop,
    engine_pids,
    free_port,
    percentile_ms,
    rss_mb,
    server_metric,
)
from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive

ISSUE_OVERLOAD_S = 300.0
CAPACITY_TOKENS = 32  # output tokens per request of serve_load.closed_loop
ISSUE_SOAK_REQUESTS = 5000


@dataclass
class Stream:
    """One streamed request as its client saw it (times on ``time.perf_counter``)."""

    status: int = 0
    retry_after: bool = False
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    error: str | None = None
    completion_tokens: int | None = None


def body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


async def stream_request(
    client: httpx.AsyncClient,
    prompt: str,
    max_tokens: int,
    stop_after_first: bool = False,
) -> Stream:
    """Stream one completion; with ``stop_after_first`` the client hangs up after its
    first token (a mid-stream disconnect)."""
    result = Stream()
    try:
        async with client.stream("POST", "/v1/completions", json=body(prompt, max_tokens)) as r:
            result.status = r.status_code
            result.retry_after = "retry-after" in r.headers
            if r.status_code != 200:
                await r.aread()
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[len("data: ") :]
                if payload == "[DONE]":
                    result.done = True
                    break
                data = json.loads(payload)
                if "error" in data:
                    result.error = data["error"]["message"]
                    continue
                if data.get("usage"):
                    result.completion_tokens = data["usage"]["completion_tokens"]
                for choice in data["choices"]:
                    if choice["text"]:
                        result.token_times.append(time.perf_counter())
                    if choice["finish_reason"] is not None:
                        result.finish_reason = choice["finish_reason"]
                if stop_after_first and result.token_times:
                    return result
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


def start_server(port: int, extra: list[str], timeout_s: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "tokenpace.server",
        "--port",
        str(port),
        "--containers",
        "2",
        "--warm-containers",
        "2",
        "--uvicorn-log-level",
        "warning",
        *extra,
    ]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + timeout_s
    url = f"http://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            health = httpx.get(f"{url}/health", timeout=2).json()
            if all(c["state"] == "warm" for c in health["containers"]):
                return process
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    stop(process)  # SIGTERM first: a server that started Ray shuts its cluster down
    raise RuntimeError(f"the server did not start within {timeout_s:.0f} s")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def load(url: str) -> tuple[int, int]:
    """(running requests, used KV blocks) summed over containers."""
    containers = httpx.get(f"{url}/health", timeout=5).json()["containers"]
    return sum(c["num_running"] for c in containers), sum(c["num_used_blocks"] for c in containers)


def wait_idle(url: str, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        containers = httpx.get(f"{url}/health", timeout=5).json()["containers"]
        if not any(c["num_running"] or c["num_waiting"] for c in containers):
            return True
        time.sleep(0.2)
    return False


def client(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=None))


async def overload(url: str, rate: float, duration_s: float, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    arrivals = []
    at = float(rng.exponential(1 / rate))
    while at < duration_s:
        # 32 tokens, as in the capacity loop: the load is 2x what was measured.
        arrivals.append((at, str(rng.choice(PROMPTS)), CAPACITY_TOKENS))
        at += float(rng.exponential(1 / rate))
    async with client(url) as http:
        start = time.perf_counter()
        tasks: list[tuple[float, asyncio.Task[Stream]]] = []
        for offset, prompt, tokens in arrivals:
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = time.perf_counter()
            tasks.append((sent, asyncio.create_task(stream_request(http, prompt, tokens))))
        results = [(sent, await task) for sent, task in tasks]
    accepted = [(s, r) for s, r in results if r.status == 200]
    ttfts = [r.token_times[0] - s for s, r in accepted if r.token_times]
    rejected = [r for _, r in results if r.status == 429]
    return {
        "duration_s": duration_s,
        "rate_rps": round(rate, 3),
        "sent": len(results),
        "accepted": len(accepted),
        "completed": sum(r.done and r.finish_reason == "length" for _, r in accepted),
        "rejected_429": len(rejected),
        "rejected_429_with_retry_after": sum(r.retry_after for r in rejected),
        "server_errors_5xx": sum(500 <= r.status < 600 or r.error is not None for _, r in results),
        "other": sum(r.status not in (200, 429) and r.status < 500 for _, r in results),
        "p99_ttft_ms_accepted": percentile_ms(ttfts, 99),
    }


async def disconnects(url: str, num_clients: int) -> dict[str, Any]:
    """Every client streams and hangs up after its first token; a client refused with a
    429 waits its Retry-After and tries again, as a well-behaved client does."""
    baseline = load(url)
    retries = 0

    async def one(http: httpx.AsyncClient, i: int) -> Stream:
        nonlocal retries
        while True:
            stream = await stream_request(http, PROMPTS[i % len(PROMPTS)], 128, True)
            if stream.status != 429:
                return stream
            retries += 1
            await asyncio.sleep(1.0)

    async with client(url) as http:
        streams = await asyncio.gather(*(one(http, i) for i in range(num_clients)))
    closed = time.perf_counter()
    running_back = blocks_back = None
    while time.perf_counter() - closed < 60:
        running, blocks = load(url)
        now = time.perf_counter() - closed
        if running_back is None and running <= baseline[0]:
            running_back = now
        if blocks_back is None and blocks <= baseline[1]:
            blocks_back = now
        if running_back is not None and blocks_back is not None:
            break
        await asyncio.sleep(0.01)
    gaps = np.diff(sorted(t for s in streams for t in s.token_times[:1]))
    itl_s = server_itl_mean(url)
    return {
        "clients": num_clients,
        "disconnected_after_first_token": sum(bool(s.token_times) for s in streams),
        "retried_after_429": retries,
        "baseline_running_blocks": list(baseline),
        "running_back_s": _round(running_back),
        "kv_back_s": _round(blocks_back),
        "step_s": _round(itl_s),
        "running_back_steps": _round(running_back / itl_s if running_back and itl_s else None),
        "kv_back_steps": _round(blocks_back / itl_s if blocks_back and itl_s else None),
        "first_token_spread_s": _round(float(gaps.sum()) if gaps.size else 0.0),
    }


def server_itl_mean(url: str) -> float | None:
    """The mean inter-token latency so far, from the server's histogram (seconds): the
    decode step time the running requests experienced."""
    total = server_metric(url, "tokenpace:inter_token_latency_seconds_sum")
    count = server_metric(url, "tokenpace:inter_token_latency_seconds_count")
    return total / count if count else None


def _json(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, **fields}).encode()


HOSTILE: list[tuple[str, bytes]] = [
    ("huge prompt", _json(prompt="hello " * 200000)),
    ("huge max_tokens", _json(prompt="x", max_tokens=10**12)),
    ("negative max_tokens", _json(prompt="x", max_tokens=-5)),
    ("negative temperature", _json(prompt="x", temperature=-1)),
    ("NaN temperature", b'{"model": "%s", "prompt": "x", "temperature": NaN}' % MODEL.encode()),
    ("NaN top_p", b'{"model": "%s", "prompt": "x", "top_p": NaN}' % MODEL.encode()),
    ("Infinity seed", b'{"model": "%s", "prompt": "x", "seed": Infinity}' % MODEL.encode()),
    ("wrong type prompt", _json(prompt={"a": 1})),
    ("wrong type stream", _json(prompt="x", stream="yes")),
    ("wrong type messages", _json(messages=7)),
    ("invalid UTF-8", b'{"model": "' + MODEL.encode() + b'", "prompt": "\xff\xfe\xfd"}'),
    ("not JSON", b"{{{{"),
    ("JSON array", b"[1, 2, 3]"),
    ("token id out of range", _json(prompt=[10**9])),
    ("10 MB body", _json(prompt="a" * (10 * 2**20))),
    ("deep nesting", b'{"model": "x", "prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
]


def hostile(url: str) -> dict[str, Any]:
    answers = []
    for name, payload in HOSTILE:
        for path in ("/v1/completions", "/v1/chat/completions"):
            try:
                r = httpx.post(
                    f"{url}{path}",
                    content=payload,
                    headers={"content-type": "application/json"},
                    timeout=120,
                )
                message = r.json().get("error", {}).get("message") if r.content else None
                answers.append((name, path, r.status_code, bool(message)))
            except (httpx.HTTPError, ValueError) as error:
                answers.append((name, path, 599, False))
                print(f"hostile {name} {path}: {error}", file=sys.stderr)
    bad = [a for a in answers if not (400 <= a[2] < 500 and a[3])]
    for name, path, status, has_message in bad:
        print(f"hostile {name} {path}: {status} message={has_message}", file=sys.stderr)
    return {
        "bodies": len(answers),
        "answered_4xx_with_message": len(answers) - len(bad),
        "server_errors_5xx": sum(a[2] >= 500 for a in answers),
    }


def fuzz(url: str, max_examples: int) -> dict[str, Any]:
    """schemathesis over the server's OpenAPI document: counts of answers by class."""
    import hypothesis
    import schemathesis

    counts = {"2xx": 0, "4xx": 0, "5xx": 0}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    for result in schema.get_all_operations():
        operation = cast(Any, result).ok()

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def check(case: Any) -> None:
            status = case.call(timeout=120).status_code
            counts["5xx" if status >= 500 else "4xx" if status >= 400 else "2xx"] += 1

        check()
    return counts


def dtype_figures(url: str) -> dict[str, Any]:
    """The precision ``--dtype auto`` chose per container and the decode step times it
    measured (ms), from /metrics."""
    chosen: dict[str, str] = {}
    steps: dict[str, dict[str, float]] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("tokenpace:engine_dtype_info{") and line.endswith(" 1.0"):
            labels = _labels(line)
            chosen[labels["container"]] = labels["dtype"]
        elif line.startswith("tokenpace:engine_dtype_step_seconds{"):
            labels = _labels(line)
            value = float(line.rsplit(" ", 1)[1]) * 1000
            steps.setdefault(labels["container"], {})[labels["dtype"]] = round(value, 1)
            steps[labels["container"]]["batch"] = float(labels["batch"])
    return {"chosen": chosen, "decode_step_ms": steps}


def _labels(line: str) -> dict[str, str]:
    inside = line[line.index("{") + 1 : line.index("}")]
    return {k: v.strip('"') for k, v in (pair.split("=", 1) for pair in inside.split(","))}


def total_rss_mb(server_pid: int, url: str) -> float:
    return rss_mb(server_pid) + sum(rss_mb(pid) for pid in engine_pids(url))


async def soak(url: str, num_requests: int, max_s: float, concurrency: int) -> tuple[int, int]:
    """(sent, completed) of short requests until ``num_requests`` or ``max_s`` seconds."""
    sent = completed = 0
    end = time.perf_counter() + max_s
    async with client(url) as http:

        async def worker() -> None:
            nonlocal sent, completed
            while sent < num_requests and time.perf_counter() < end:
                sent += 1
                payload = body(PROMPTS[sent % len(PROMPTS)], 2, stream=False)
                r = await http.post("/v1/completions", json=payload)
                completed += r.status_code == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent, completed


async def kill_mid_stream(url: str, num_streams: int, max_tokens: int) -> dict[str, Any]:
    """Start streams, kill -9 the engine process running them, let them finish."""
    async with client(url) as http:
        tasks = [
            asyncio.create_task(stream_request(http, PROMPTS[i % len(PROMPTS)], max_tokens))
            for i in range(num_streams)
        ]
        victim = None
        deadline = time.perf_counter() + 120
        while victim is None and time.perf_counter() < deadline:
            containers = httpx.get(f"{url}/health", timeout=5).json()["containers"]
            busy = [c for c in containers if c["num_running"] and c["pid"]]
            if busy:
                victim = max(busy, key=lambda c: c["num_running"])
            else:
                await asyncio.sleep(0.05)
        if victim is None:
            raise RuntimeError("no container started the streams")
        await asyncio.sleep(1.0)  # let tokens flow
        killed_at = time.perf_counter()
        os.kill(int(victim["pid"]), signal.SIGKILL)
        streams = await asyncio.gather(*tasks)
    on_victim = [s for s in streams if any(t < killed_at for t in s.token_times)]
    resumed = [
        s
        for s in streams
        if s.done and s.finish_reason == "length" and s.completion_tokens == max_tokens
    ]
    gaps = []
    for s in streams:
        after = [t for t in s.token_times if t >= killed_at]
        before = [t for t in s.token_times if t < killed_at]
        if after and before:
            gaps.append(after[0] - killed_at)
    return {
        "streams": num_streams,
        "killed_pid_running": int(victim["num_running"]),
        "streams_with_tokens_before_kill": len(on_victim),
        "streams_completed_in_full": len(resumed),
        "streams_failed": num_streams - len(resumed),
        "time_to_resume_s_max": _round(max(gaps) if gaps else None),
        "engine_restarts": server_metric(url, "tokenpace:engine_restarts_total"),
        "migrations": server_metric(url, "tokenpace:migrations_total"),
    }


async def sigterm_during_load(
    url: str, process: subprocess.Popen[bytes], num_streams: int
) -> dict[str, Any]:
    async with client(url) as http:
        tasks = [
            asyncio.create_task(stream_request(http, PROMPTS[i % len(PROMPTS)], 24))
            for i in range(num_streams)
        ]
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline and load(url)[0] == 0:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        streams = await asyncio.gather(*tasks)
    accepted = [s for s in streams if s.status == 200]
    return {
        "streams": num_streams,
        "accepted": len(accepted),
        "accepted_ended_with_done": sum(s.done for s in accepted),
        "finish_reasons": sorted({str(s.finish_reason) for s in accepted}),
        "server_exit_code": process.wait(120),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of this benchmark."""

    capacity_s: float = option(15.0, "Seconds of the closed loop measuring capacity.")
    concurrency: int = option(
        16, "Closed-loop clients measuring capacity: enough to fill both containers' B0."
    )
    load_factor: float = option(2.0, "Overload arrival rate as a multiple of capacity.")
    overload_s: float = option(60.0, "Seconds of overload.")
    disconnect_clients: int = option(50, "Streams dropped after their first token.")
    fuzz_examples: int = option(10, "schemathesis examples per operation.")
    soak_requests: int = option(ISSUE_SOAK_REQUESTS, "Short requests of the soak.")
    soak_max_s: float = option(120.0, "The soak stops after this many seconds.")
    max_queued_requests: int = option(16, "The server's admission queue bound.")
    kill_streams: int = option(4, "Streams running when an engine worker is killed.")
    skip_ray: bool = option(False, "Skip the kill -9 check on Ray actors.")
    seed: int = option(0, "Seed of the overload arrivals.")
    start_timeout_s: float = option(400.0, "Seconds a server may take to start.")
    server_args: str = option("", "More `tokenpace serve` flags.")

    def __post_init__(self) -> None:
        require_positive(
            self, "capacity_s", "concurrency", "load_factor", "overload_s", "soak_max_s",
            "max_queued_requests", "kill_streams", "start_timeout_s",
        )  # fmt: skip


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/reliability.py", description=__doc__)


def run(args: Settings) -> None:
    began = time.perf_counter()
    extra = ["--max-queued-requests", str(args.max_queued_requests), *args.server_args.split()]
    result: dict[str, Any] = {"config": asdict(args)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start_server(port, extra, args.start_timeout_s)
    try:
        result["dtype"] = dtype_figures(url)
        log("dtype", result["dtype"])
        capacity = asyncio.run(closed_loop(url, args.concurrency, args.capacity_s))
        result["capacity_rps"] = round(capacity, 3)
        wait_idle(url)
        result["overload"] = asyncio.run(
            overload(url, args.load_factor * capacity, args.overload_s, args.seed)
        )
        wait_idle(url)
        log("overload", result["overload"])
        result["disconnect"] = asyncio.run(disconnects(url, args.disconnect_clients))
        log("disconnect", result["disconnect"])
        wait_idle(url)
        result["hostile"] = hostile(url)
        result["hostile"]["schemathesis"] = fuzz(url, args.fuzz_examples)
        result["hostile"]["healthy_after"] = httpx.get(f"{url}/health").status_code == 200
        log("hostile", result["hostile"])
        wait_idle(url)
        rss_before = total_rss_mb(process.pid, url)
        kv_before = load(url)[1]
        start = time.perf_counter()
        sent, completed = asyncio.run(
            soak(url, args.soak_requests, args.soak_max_s, args.concurrency)
        )
        wait_idle(url)
        rss_after = total_rss_mb(process.pid, url)
        result["soak"] = {
            "requests": sent,
            "completed": completed,
            "seconds": round(time.perf_counter() - start, 1),
            "rss_mb_before": round(rss_before, 1),
            "rss_mb_after": round(rss_after, 1),
            "rss_change_pct": round(100 * (rss_after - rss_before) / rss_before, 2),
            "kv_blocks_before": kv_before,
            "kv_blocks_after": load(url)[1],
        }
        log("soak", result["soak"])
        result["kill9"] = asyncio.run(kill_mid_stream(url, args.kill_streams, 48))
        log("kill9", result["kill9"])
        wait_idle(url)
        result["sigterm"] = asyncio.run(sigterm_during_load(url, process, 8))
        log("sigterm", result["sigterm"])
    finally:
        stop(process)
    if not args.skip_ray:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        try:
            # The precision auto chose on this machine: the Ray engines need not measure again.
            chosen = sorted(set(result["dtype"]["chosen"].values())) or ["auto"]
            dtype = chosen[0] if len(chosen) == 1 else "auto"
            # One CPU per engine actor: both fit on a local cluster of a 2-core machine.
            ray_flags = [*extra, "--ray-address", "local", "--dtype", dtype]
            ray_flags += ["--ray-cpus-per-engine", "1", "--num-threads", "1"]
            process = start_server(port, ray_flags, args.start_timeout_s)
        except RuntimeError as error:
            result["kill9_ray"] = {"error": str(error)}
        else:
            try:
                result["kill9_ray"] = asyncio.run(kill_mid_stream(url, args.kill_streams, 48))
            finally:
                stop(process)
        log("kill9_ray", result["kill9_ray"])
    result["scaled_down"] = {
        "overload_s": {"issue": ISSUE_OVERLOAD_S, "run": args.overload_s},
        "soak_requests": {"issue": ISSUE_SOAK_REQUESTS, "run": result["soak"]["requests"]},
    }
    result["wall_s"] = round(time.perf_counter() - began, 1)
    print(json.dumps(result))


def log(name: str, value: Any) -> None:
    print(name, json.dumps(value), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

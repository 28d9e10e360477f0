"""A burst on ``tokenpace serve --containers 3 --keep-alive 5``: the pool scales out, moves
running requests live to the containers that come up, and scales back to zero.

One server process (embedded SmolLM2, ``--router serverlessllm``, one container warm at
start). First each distinct prompt runs alone, greedy, one request at a time: the reference
outputs of an unmigrated run. Then ``--requests`` greedy streams (the prompts in rotation,
``--max-tokens`` tokens each, EOS ignored) arrive ``--spacing`` seconds apart; the
autoscaler (``--target-per-container``) starts the cold containers and, as each comes up
idle, it takes a running request from the busiest container (``--migration-batch-threshold``).
``/metrics`` is polled throughout. Reported: the most containers warm or loading at once,
whether and how soon after the burst the pool was back to zero, live migrations, resumes,
cold starts, requests sent / completed with every token / lost, and how many outputs equal
the unmigrated reference. Prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive

MODEL = "smollm2-135m-instruct"
PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how rain forms, step by step.",
    "List some facts about the moon.",
    "Describe a walk through a busy market in the morning.",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    total = 0.0
    for line in text.splitlines():
        match = pattern.match(line)
        if match and labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


class Watcher:
    """Polls /metrics; keeps the container counts by state over time."""

    def __init__(self, url: str, period_s: float = 0.2) -> None:
        self.url = url
        self.period_s = period_s
        self.samples: list[tuple[float, int, int, int]] = []  # (t, cold, loading, warm)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                text = httpx.get(f"{self.url}/metrics", timeout=5).text
            except httpx.HTTPError:
                continue
            counts = [
                int(metric(text, "tokenpace:num_containers", f'state="{s}"'))
                for s in ("cold", "loading", "warm")
            ]
            self.samples.append((time.monotonic(), counts[0], counts[1], counts[2]))
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def complete(url: str, prompt: str, max_tokens: int) -> tuple[str, int, bool]:
    """Stream one greedy completion; (text, tokens received, finished with every token)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, tokens, usage = "", 0, None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[len("data: ") :])
                if "error" in data:
                    return text, tokens, False
                if data.get("usage"):
                    usage = data["usage"]["completion_tokens"]
                for choice in data.get("choices", []):
                    if choice["text"]:
                        text += choice["text"]
                        tokens += 1
    except httpx.HTTPError:
        return text, tokens, False
    return text, tokens, usage == max_tokens


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of ``bench/serve_pool.py``."""

    requests: int = option(8, "Requests in the burst.")
    max_tokens: int = option(96, "Tokens per request.")
    spacing: float = option(0.2, "Seconds between arrivals.")
    target_per_container: float = option(2.0, "serve's autoscaler target per container.")
    migration_batch_threshold: int = option(2, "serve's live-migration batch threshold.")
    zero_timeout: float = option(90.0, "Seconds to wait for the pool to reach zero.")
    start_timeout: float = option(300.0, "Seconds the server may take to start.")

    def __post_init__(self) -> None:
        require_positive(
            self, "requests", "max_tokens", "spacing", "target_per_container",
            "migration_batch_threshold", "zero_timeout", "start_timeout",
        )  # fmt: skip


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/serve_pool.py", description=__doc__)


def run(args: Settings) -> None:
    """Run the burst against a three-container serve pool; print the JSON line."""

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "tokenpace.server", "--port", str(port),
        "--containers", "3", "--keep-alive", "5", "--warm-containers", "1",
        "--router", "serverlessllm", "--scheduler", "fcfs", "--dtype", "float32",
        "--target-per-container", str(args.target_per_container),
        "--migration-batch-threshold", str(args.migration_batch_threshold),
        "--uvicorn-log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    started = time.monotonic()
    server = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + args.start_timeout
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.5)
        reference = {p: complete(url, p, args.max_tokens)[0] for p in PROMPTS}
        watcher = Watcher(url)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
        burst_start = time.monotonic()
        with ThreadPoolExecutor(len(prompts)) as pool:
            futures = []
            for prompt in prompts:
                futures.append(pool.submit(complete, url, prompt, args.max_tokens))
                time.sleep(args.spacing)
            results = [f.result() for f in futures]
        burst_end = time.monotonic()
        zero_at = None
        while time.monotonic() < burst_end + args.zero_timeout:
            last = watcher.samples[-1] if watcher.samples else None
            if last is not None and last[0] > burst_end and last[1] == 3:
                zero_at = last[0]
                break
            time.sleep(0.2)
        watcher.stop()
        text = httpx.get(f"{url}/metrics", timeout=5).text
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    active = [loading + warm for t, _cold, loading, warm in watcher.samples if t >= burst_start]
    completed = sum(ok for _text, _tokens, ok in results)
    equal = sum(text_ == reference[p] for (text_, _t, _ok), p in zip(results, prompts, strict=True))
    summary = {
        "containers": 3,
        "keep_alive_s": 5.0,
        "max_active_containers": max(active, default=0),
        "scaled_to_zero": zero_at is not None,
        "seconds_to_zero_after_burst": None if zero_at is None else round(zero_at - burst_end, 2),
        "migrations": metric(text, "tokenpace:migrations_total"),
        "resumes": metric(text, "tokenpace:resumes_total"),
        "cold_starts": metric(text, "tokenpace:cold_starts_total"),
        "requests_sent": len(prompts),
        "requests_completed": completed,
        "requests_lost": len(prompts) - completed,
        "greedy_equal_to_unmigrated": equal,
        "burst_s": round(burst_end - burst_start, 2),
        "wall_s": round(time.monotonic() - started, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

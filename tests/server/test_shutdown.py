"""Graceful shutdown of a real ``python -m tokenpace.server`` process on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import MODEL, sse_payloads

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(port: int, *flags: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "tokenpace.server", "--port", str(port), *flags]
    process = subprocess.Popen(command, env=env, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited with {process.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise AssertionError("the server did not start")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_finishes_short_work_aborts_long_work_and_stops_engines(
    native_profile: str,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(
        port,
        *("--dtype", "float32", "--profile", native_profile),
        *("--shutdown-timeout-s", "3", "--uvicorn-log-level", "warning"),
    )
    try:
        engine_pid = httpx.get(f"{url}/health").json()["containers"][0]["pid"]
        results: dict[str, object] = {}

        def long_stream() -> None:
            body = {
                "model": MODEL,
                "prompt": "Count slowly.",
                "max_tokens": 1500,
                "ignore_eos": True,
                "stream": True,
            }
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            results["long"] = sse_payloads(response.text)

        def short_request() -> None:
            body = {"model": MODEL, "prompt": "Hi", "max_tokens": 8, "ignore_eos": True}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            results["short"] = response.status_code

        threads = [threading.Thread(target=long_stream), threading.Thread(target=short_request)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(120)
        # uvicorn re-raises the signal it caught once its graceful shutdown is done.
        assert process.wait(60) in (0, -signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
    assert results["short"] == 200
    long = results["long"]
    assert isinstance(long, list) and long[-1] == "[DONE]"
    assert '"finish_reason": "abort"' in long[-2]
    assert not alive(engine_pid)

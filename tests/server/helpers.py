"""Small HTTP helpers for the serve tests."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
# A request that streams long enough (96 tokens) to be interrupted mid-way.
LONG = {
    "model": MODEL,
    "prompt": "Tell me a long story about a lighthouse.",
    "max_tokens": 96,
    "temperature": 0,
    "ignore_eos": True,
}


def sse_payloads(body: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]


def stream_text(payloads: list[str], chat: bool) -> str:
    text = ""
    for payload in payloads:
        if payload == "[DONE]":
            break
        for choice in json.loads(payload)["choices"]:
            text += (choice["delta"].get("content") or "") if chat else choice["text"]
    return text


def metric(base_url: str, name: str, labels: str = "") -> float:
    """The sum of every sample of ``name`` whose label text contains ``labels``."""
    body = httpx.get(f"{base_url}/metrics").text
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    for line in body.splitlines():
        match = pattern.match(line)
        if match and labels in (match.group(1) or ""):
            total += float(match.group(2))
    return total


def wait_until_idle(base_url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Poll /health until no container runs, waits or holds KV; returns the last body."""
    deadline = time.monotonic() + timeout_s
    while True:
        body: dict[str, Any] = httpx.get(f"{base_url}/health").json()
        busy = any(
            c["num_running"] or c["num_waiting"] or c["num_used_blocks"] for c in body["containers"]
        )
        if not busy or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def health(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/health").json()
    return body


def wait_for(predicate: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def busy_container(url: str) -> dict[str, Any]:
    """The container running a request (waits until one does)."""
    found: list[dict[str, Any]] = []

    def running() -> bool:
        found[:] = [c for c in health(url)["containers"] if c["num_running"]]
        return bool(found)

    wait_for(running, "no container started the request")
    return found[0]


def stream_in_background(url: str, body: dict[str, Any]) -> tuple[threading.Thread, list[str]]:
    lines: list[str] = []

    def run() -> None:
        response = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=180)
        lines.extend(sse_payloads(response.text))

    thread = threading.Thread(target=run)
    thread.start()
    return thread, lines

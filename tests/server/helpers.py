"""Small HTTP helpers for the serve tests."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"


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

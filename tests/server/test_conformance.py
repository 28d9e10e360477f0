"""Conformance: the clients people point at an OpenAI-style server all read the same
answer from this one, streamed and not, completions and chat.

Clients: the official ``openai`` package; raw ``httpx`` streaming (bytes as they come);
a line-buffered SSE parser (splits on ``\\n``, keeps ``data:`` lines); a blank-line-buffered
parser (buffers bytes and splits events on ``\\n\\n``, as benchmark clients do). Every
client must see the text a plain non-streamed request returns, and streams must carry the
usage chunk and end with ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer
from tests.server.helpers import MODEL

pytestmark = pytest.mark.slow

PROMPTS: dict[str, dict[str, Any]] = {
    "completions": {"prompt": "A short poem about the sea:"},
    "chat/completions": {"messages": [{"role": "user", "content": "Name three fruits."}]},
}
BASE = {"model": MODEL, "max_tokens": 12, "temperature": 0}


def text_of(choice: dict[str, Any], chat: bool, streamed: bool) -> str:
    if not chat:
        return str(choice["text"])
    part = choice["delta"] if streamed else choice["message"]
    return str(part.get("content") or "")


def from_events(events: list[str], chat: bool) -> tuple[str, dict[str, Any]]:
    """(text, usage) of a stream's ``data:`` payloads; checks ``[DONE]`` ends it."""
    assert events and events[-1] == "[DONE]", events[-3:]
    text, usage = "", {}
    for payload in events[:-1]:
        chunk = json.loads(payload)
        for choice in chunk["choices"]:
            text += text_of(choice, chat, streamed=True)
        if chunk.get("usage"):
            usage = chunk["usage"]
    return text, usage


def post_stream(url: str, path: str, body: dict[str, Any]) -> Iterator[bytes]:
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{url}/v1/{path}", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield from response.iter_raw()


def raw_httpx(url: str, path: str, body: dict[str, Any]) -> list[str]:
    """The whole byte stream read raw, then split into events on blank lines."""
    data = b"".join(post_stream(url, path, body)).decode()
    return [e.removeprefix("data: ") for e in data.split("\n\n") if e]


def line_buffered(url: str, path: str, body: dict[str, Any]) -> list[str]:
    """Split arriving bytes into lines; keep ``data:`` lines, skip blank ones."""
    events, pending = [], b""
    for piece in post_stream(url, path, body):
        pending += piece
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode().rstrip("\r")
            if text.startswith("data:"):
                events.append(text[len("data:") :].strip())
    return events


def blank_line_buffered(url: str, path: str, body: dict[str, Any]) -> list[str]:
    """Buffer arriving bytes and cut an event at every ``\\n\\n``; each must be one
    ``data: `` line that parses."""
    events, pending = [], b""
    for piece in post_stream(url, path, body):
        pending += piece
        *complete, pending = pending.split(b"\n\n")
        for event in complete:
            text = event.decode()
            assert text.startswith("data: "), repr(text)
            payload = text.removeprefix("data: ")
            if payload != "[DONE]":
                json.loads(payload)
            events.append(payload)
    assert pending == b""
    return events


def openai_client(url: str, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    chat = path.startswith("chat")
    fields = {k: v for k, v in body.items() if k != "model"}
    create: Callable[..., Any] = (
        client.chat.completions.create if chat else client.completions.create
    )
    if not body.get("stream"):
        answer = create(model=MODEL, **fields)
        choice = answer.choices[0]
        text = (choice.message.content or "") if chat else choice.text
        return text, answer.usage.model_dump()
    text, usage = "", {}
    for chunk in create(model=MODEL, **fields):
        for choice in chunk.choices:
            text += (choice.delta.content or "") if chat else choice.text
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    return text, usage


def plain(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/{path}", json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


STREAM_PARSERS = {
    "raw-httpx": raw_httpx,
    "line-buffered": line_buffered,
    "blank-line-buffered": blank_line_buffered,
}
CLIENTS = ["openai", *STREAM_PARSERS]


@pytest.fixture(scope="module")
def expected(server: RunningServer) -> dict[str, dict[str, Any]]:
    """The non-streamed answer per endpoint, read with httpx."""
    return {path: plain(server.url, path, {**BASE, **extra}) for path, extra in PROMPTS.items()}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("path", list(PROMPTS))
@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_reads_the_same_answer(
    server: RunningServer,
    expected: dict[str, dict[str, Any]],
    client: str,
    path: str,
    stream: bool,
) -> None:
    chat = path.startswith("chat")
    reference = expected[path]
    want_text = text_of(reference["choices"][0], chat, streamed=False)
    want_usage = reference["usage"]
    body = {**BASE, **PROMPTS[path]}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if client == "openai":
        text, usage = openai_client(server.url, path, body)
    elif stream:
        text, usage = from_events(STREAM_PARSERS[client](server.url, path, body), chat)
    else:
        answer = plain(server.url, path, body)
        text, usage = text_of(answer["choices"][0], chat, streamed=False), answer["usage"]
    assert text == want_text
    assert {k: usage[k] for k in want_usage} == want_usage

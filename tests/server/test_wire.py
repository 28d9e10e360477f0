"""Wire details OpenAI-style clients rely on: event framing, usage chunks, vLLM's
extensions and endpoints, and a 400 naming every field the server does not honour."""

from __future__ import annotations

import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.server.conftest import API_KEY, RunningServer
from tests.server.helpers import MODEL, sse_payloads

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "temperature": 0}


def raw_post(url: str, path: str, body: dict[str, Any], settle_s: float) -> bytes:
    """POST over a bare socket, wait ``settle_s`` so the server writes several events
    before the first read, then read everything: events arrive coalesced, as a loaded
    client meets them. Returns the body bytes (chunked transfer decoded)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        sock.sendall(request)
        time.sleep(settle_s)
        received = b""
        while chunk := sock.recv(1 << 20):
            received += chunk
    head, _, raw = received.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0], head
    assert b"transfer-encoding: chunked" in head.lower()
    return _dechunk(raw)


def _dechunk(raw: bytes) -> bytes:
    body = b""
    while True:
        size_line, _, raw = raw.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return body
        body += raw[:size]
        raw = raw[size + 2 :]


def strict_events(body: bytes) -> list[str]:
    """Split on ``\\n\\n`` only: every event must be one ``data: `` line, no ``\\r``."""
    assert body.endswith(b"\n\n")
    assert b"\r" not in body
    events = body[:-2].split(b"\n\n")
    payloads = []
    for event in events:
        text = event.decode()
        assert text.startswith("data: ") and "\n" not in text, repr(text)
        payloads.append(text[len("data: ") :])
    return payloads


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_coalesced_stream_splits_on_blank_lines(server: RunningServer, path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "temperature": 0, "max_tokens": 12, "stream": True}
    body.update(CHAT if "chat" in path else {"prompt": "Count: one, two,"})
    body["stream_options"] = {"include_usage": True}
    payloads = strict_events(raw_post(server.url, path, body, settle_s=2.0))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    assert usage["usage"]["total_tokens"] == (
        usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"]
    )
    # As OpenAI sends them: every other chunk has "usage": null and one choice.
    assert all(c["usage"] is None and len(c["choices"]) == 1 for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stream_without_usage_has_no_usage_field(server: RunningServer) -> None:
    body = {**CHAT, "max_tokens": 4, "stream": True}
    payloads = strict_events(raw_post(server.url, "/v1/chat/completions", body, settle_s=0))
    assert all("usage" not in json.loads(p) for p in payloads[:-1])


def test_models_report_max_model_len(server: RunningServer) -> None:
    card = httpx.get(f"{server.url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == server.server.options.max_model_len  # type: ignore[attr-defined]


def test_tokenize_and_detokenize_round_trip(server: RunningServer) -> None:
    text = "The lighthouse keeper"
    answer = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "prompt": text}).json()
    assert answer["count"] == len(answer["tokens"]) > 0
    assert answer["max_model_len"] == server.server.options.max_model_len  # type: ignore[attr-defined]
    back = httpx.post(f"{server.url}/detokenize", json={"tokens": answer["tokens"]}).json()
    assert back["prompt"] == text


def test_tokenize_chat_counts_the_prompt_the_server_runs(server: RunningServer) -> None:
    counted = httpx.post(f"{server.url}/tokenize", json={"messages": CHAT["messages"]}).json()
    body = {**CHAT, "max_tokens": 1}
    usage = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert counted["count"] == usage["usage"]["prompt_tokens"]


def test_tokenize_bad_input(server: RunningServer) -> None:
    both = httpx.post(f"{server.url}/tokenize", json={"prompt": "a", "messages": CHAT["messages"]})
    assert both.status_code == 400
    vocab = httpx.post(f"{server.url}/detokenize", json={"tokens": [10**9]})
    assert vocab.status_code == 400 and vocab.json()["error"]["param"] == "tokens"


def test_version(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/version").json()["version"]


def test_tokenizer_info_is_opt_in_guarded_and_enough_to_tokenize_chats(
    server: RunningServer, guarded_server: RunningServer
) -> None:
    """As in vLLM, ``/tokenizer_info`` answers only with --enable-tokenizer-info-endpoint;
    what it answers renders a chat to the ids the server runs (lm-evaluation-harness's
    remote tokenizer renders the template itself and tokenizes through ``/tokenize``)."""
    from jinja2 import Environment

    assert httpx.get(f"{server.url}/tokenizer_info").status_code == 404
    url = f"{guarded_server.url}/tokenizer_info"
    assert httpx.get(url).status_code == 401
    headers = {"Authorization": f"Bearer {API_KEY}"}
    info = httpx.get(url, headers=headers).json()
    assert info["tokenizer_class"] and isinstance(info["eos_token"], str)
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)
    template = Environment(trim_blocks=True, lstrip_blocks=True).from_string(info["chat_template"])
    rendered = template.render(messages=CHAT["messages"], add_generation_prompt=True)
    tokenize = f"{guarded_server.url}/tokenize"
    by_text = httpx.post(
        tokenize, json={"prompt": rendered, "add_special_tokens": False}, headers=headers
    ).json()
    by_server = httpx.post(tokenize, json={"messages": CHAT["messages"]}, headers=headers).json()
    assert by_text["tokens"] == by_server["tokens"]
    eos = httpx.post(
        tokenize, json={"prompt": info["eos_token"], "add_special_tokens": False}, headers=headers
    ).json()
    assert eos["count"] == 1


def test_min_tokens_holds_off_eos(server: RunningServer) -> None:
    short = httpx.post(
        f"{server.url}/v1/chat/completions", json={**CHAT, "max_tokens": 64}, timeout=60
    ).json()
    natural = short["usage"]["completion_tokens"]
    assert short["choices"][0]["finish_reason"] == "stop" and natural < 40
    body = {**CHAT, "max_tokens": 64, "min_tokens": natural + 8}
    longer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    assert longer["usage"]["completion_tokens"] >= natural + 8


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": []}, "tools"),
        ({"best_of": 2}, "best_of"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"min_tokens": 50, "max_tokens": 8}, "min_tokens"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"echo": True}, "echo"),
    ],
)
def test_unhonoured_fields_are_rejected_by_name(
    server: RunningServer, body: dict[str, Any], param: str
) -> None:
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param)
    assert param in error["message"]


def test_unknown_field_in_a_message_is_named(server: RunningServer) -> None:
    messages = [{"role": "user", "content": "hi", "tool_calls": []}]
    response = httpx.post(f"{server.url}/v1/chat/completions", json={**CHAT, "messages": messages})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].tool_calls"


def test_completions_reject_chat_only_fields(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "suffix": "y"}
    response = httpx.post(f"{server.url}/v1/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "suffix"


def test_oversized_body_is_413_before_parsing(server: RunningServer) -> None:
    body = json.dumps({"model": MODEL, "prompt": "a" * (5 * 2**20)}).encode()
    response = httpx.post(
        f"{server.url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "limit" in response.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_prompt_too_long_for_any_tokenization_is_refused_untokenized(server: RunningServer) -> None:
    start = time.perf_counter()
    body = {"model": MODEL, "prompt": "a" * 2_000_000, "max_tokens": 1}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    # Tokenizing two million characters takes seconds; the bound answers at once.
    assert time.perf_counter() - start < 4.0


def test_each_prompt_of_a_batch_is_held_to_the_character_bound_alone(
    server: RunningServer,
) -> None:
    """Two prompts each under the untokenized bound, together over it: the bound passes
    them (each is a request of its own), and the context refuses them on their tokens."""
    limits = server.server.service.limits  # type: ignore[attr-defined]
    chars = int(0.6 * limits.context_tokens * limits.max_token_chars)
    body = {"model": MODEL, "prompt": ["a " * (chars // 2)] * 2, "max_tokens": 1}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "prompt" and "tokens" in error["message"]
    assert "characters" not in error["message"]


def test_continuous_usage_stats_give_every_chunk_its_choices_usage_so_far(
    server: RunningServer,
) -> None:
    """vLLM's ``continuous_usage_stats``: each chunk's usage is its choice's so far
    (never decreasing, prompt plus completion), the last chunk of a choice has its whole
    count, and the usage chunk at the end still sums every choice."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    for path, extra in (
        ("completions", {"prompt": ["Once upon a time", "Hello"], "n": 2}),
        ("chat/completions", {"messages": CHAT["messages"]}),
    ):
        body = {"model": MODEL, "temperature": 0, "max_tokens": 8, **extra}
        whole = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=120).json()
        streamed = httpx.post(
            f"{server.url}/v1/{path}",
            json={**body, "stream": True, "stream_options": options},
            timeout=120,
        )
        payloads = [json.loads(p) for p in sse_payloads(streamed.text)[:-1]]
        assert payloads[-1]["choices"] == [] and payloads[-1]["usage"] == whole["usage"]
        so_far: dict[int, int] = {}
        for data in payloads[:-1]:
            (choice,) = data["choices"]
            usage = data["usage"]
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            assert usage["completion_tokens"] >= so_far.get(choice["index"], 0)
            so_far[choice["index"]] = usage["completion_tokens"]
        assert len(so_far) == len(whole["choices"])
        assert sum(so_far.values()) == whole["usage"]["completion_tokens"]

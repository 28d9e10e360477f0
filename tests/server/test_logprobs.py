"""``logprobs``, ``top_logprobs`` and ``echo`` computed by the served engine, checked
against a direct forward pass of the same checkpoint with transformers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer
from tests.server.helpers import MODEL, sse_payloads
from tests.server.reference_model import TOLERANCE, Reference, close

pytestmark = pytest.mark.slow

PROMPT = "The old lighthouse keeper climbed the stairs and"


@pytest.fixture(scope="module")
def reference(server: RunningServer) -> Iterator[Reference]:
    yield Reference.of(server)


def prompt_ids(url: str, body: dict[str, Any]) -> list[int]:
    ids: list[int] = httpx.post(f"{url}/tokenize", json=body).json()["tokens"]
    return ids


def assert_top_matches(served: dict[str, float], row: Any, k: int, reference: Reference) -> None:
    """The served top-k equals the forward pass's, except that two candidates within the
    dtype's rounding of each other may swap places at the edge of the top k."""
    dtype = reference.dtype
    smallest = min(served.values())
    best = row.topk(k)
    for token, value in zip(best.indices.tolist(), best.values.tolist(), strict=True):
        key = reference.text(token)
        if key in served:
            assert close(served[key], value, dtype), key
        else:
            assert close(smallest, value, dtype), key


def test_completion_logprobs_and_echo_match_a_forward_pass(
    server: RunningServer, reference: Reference
) -> None:
    ids = prompt_ids(server.url, {"prompt": PROMPT})
    body = {"model": MODEL, "prompt": ids, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(
        f"{server.url}/v1/completions", json={**body, "logprobs": 3, "echo": True}, timeout=60
    ).json()
    lp = answer["choices"][0]["logprobs"]
    output = reference.greedy(ids, 6)
    expected = reference.logprobs([*ids, *output])
    dtype = reference.dtype
    everything = [*ids, *output]
    assert lp["tokens"] == [reference.text(t) for t in everything]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for position in range(1, len(everything)):
        row = expected[position - 1]
        got = lp["token_logprobs"][position]
        assert close(got, float(row[everything[position]]), dtype), position
        assert_top_matches(lp["top_logprobs"][position], row, 3, reference)
    text = answer["choices"][0]["text"]
    assert text.startswith(reference.tokenizer.decode(ids))
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"][len(ids)] == len(reference.tokenizer.decode(ids))


def test_chat_logprobs_and_top_logprobs_match_a_forward_pass(
    server: RunningServer, reference: Reference
) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    ids = prompt_ids(server.url, {"messages": messages})
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    content = answer["choices"][0]["logprobs"]["content"]
    output = reference.greedy(ids, 5)
    expected = reference.logprobs([*ids, *output])
    dtype = reference.dtype
    served_text = [c["token"] for c in content]
    tokens = list(output)
    agree = next(
        (i for i, t in enumerate(output) if served_text[i] != reference.text(t)), len(output)
    )
    if agree < len(output):
        # The engine's products sum in another order than the forward pass's: its greedy
        # choice may differ only where the pass's two best tokens tie to the dtype's
        # rounding; from there the two continuations differ, so the check ends there.
        top = expected[len(ids) - 1 + agree].topk(2)
        best = {reference.text(int(t)): int(t) for t in top.indices}
        assert served_text[agree] in best, (served_text, [reference.text(t) for t in output])
        # Each of the two may sit the dtype's tolerance from the pass's value.
        absolute, relative = TOLERANCE[dtype]
        gap = float(top.values[0] - top.values[1])
        assert gap <= 2 * (absolute + relative * abs(float(top.values[0]))), gap
        tokens[agree] = best[served_text[agree]]
        content = content[: agree + 1]
    for i, entry in enumerate(content):
        row = expected[len(ids) - 1 + i]
        assert close(entry["logprob"], float(row[tokens[i]]), dtype)
        assert entry["bytes"] == list(entry["token"].encode())
        served = {t["token"]: t["logprob"] for t in entry["top_logprobs"]}
        assert len(served) == 2
        assert_top_matches(served, row, 2, reference)


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_logprobs_equal_the_whole_answer(server: RunningServer, chat: bool) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 10, "temperature": 0}
    if chat:
        path = "chat/completions"
        body.update(messages=[{"role": "user", "content": "Say hi"}], logprobs=True)
        body["top_logprobs"] = 1
    else:
        path = "completions"
        body.update(prompt="Once upon a time", logprobs=1, echo=True)
    whole = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60).json()
    stream = httpx.post(f"{server.url}/v1/{path}", json={**body, "stream": True}, timeout=60)
    chunks = [json.loads(p) for p in sse_payloads(stream.text)[:-1]]
    pieces = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    expected = whole["choices"][0]["logprobs"]
    if chat:
        assert [e for p in pieces for e in p["content"]] == expected["content"]
    else:
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            assert [v for p in pieces for v in p[key]] == expected[key], key
        streamed_text = "".join(c["choices"][0]["text"] for c in chunks)
        assert streamed_text == whole["choices"][0]["text"]


def test_no_logprobs_unless_asked(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["logprobs"] is None
    echoed = httpx.post(
        f"{server.url}/v1/completions", json={**body, "echo": True}, timeout=60
    ).json()
    assert echoed["choices"][0]["text"].startswith("Hi")
    assert echoed["choices"][0]["logprobs"] is None

"""Completions and chat completions against a real server, with httpx and the openai client."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer
from tests.server.helpers import MODEL, metric, sse_payloads, stream_text

GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 8}


def test_models_and_health(server: RunningServer) -> None:
    models = httpx.get(f"{server.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok"
    assert health["containers"][0]["state"] == "warm"


def test_completion_non_streaming_has_usage(server: RunningServer) -> None:
    body = {**GREEDY, "prompt": "The capital of France is"}
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion"
    choice = data["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert choice["text"]
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0
    assert 1 <= usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_streamed_text_equals_non_streamed_text(server: RunningServer) -> None:
    for path, extra, chat in (
        ("completions", {"prompt": "Once upon a time"}, False),
        ("chat/completions", {"messages": [{"role": "user", "content": "Say hi"}]}, True),
    ):
        body = {**GREEDY, **extra}
        whole = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60).json()
        streamed = httpx.post(
            f"{server.url}/v1/{path}",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            timeout=60,
        )
        assert streamed.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(streamed.text)
        assert payloads[-1] == "[DONE]"
        usage_chunk = json.loads(payloads[-2])
        assert usage_chunk["choices"] == []
        assert usage_chunk["usage"] == whole["usage"]
        choice = whole["choices"][0]
        expected = choice["message"]["content"] if chat else choice["text"]
        assert stream_text(payloads, chat) == expected


def test_stop_string_is_cut_from_the_output(server: RunningServer) -> None:
    body = {**GREEDY, "prompt": "Count: 1, 2, 3, 4, 5, 6,", "max_tokens": 16}
    full = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    text = full["choices"][0]["text"]
    assert len(text) > 3
    stop = text[2:4]
    cut = httpx.post(f"{server.url}/v1/completions", json={**body, "stop": [stop]}, timeout=60)
    choice = cut.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == text[: text.index(stop)]


def test_seeded_sampling_is_reproducible(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 6, "temperature": 1.0, "seed": 7}
    first = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    second = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_top_k_of_one_is_greedy_and_min_p_is_accepted(server: RunningServer) -> None:
    """vLLM's sampling extensions: top_k 1 leaves the most likely token alone, whatever the
    temperature; a min_p of 1 likewise (nothing but the most likely is within it)."""
    body = {**GREEDY, "prompt": "The capital of France is", "max_tokens": 6}
    greedy = _complete(server.url, body)["choices"][0]["text"]
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = {**body, "temperature": 1.5, "seed": 9, **extra}
        assert _complete(server.url, sampled)["choices"][0]["text"] == greedy
    loose = {**body, "temperature": 1.0, "seed": 9, "top_k": -1, "min_p": 0.05, "top_p": 0.9}
    assert _complete(server.url, loose)["choices"][0]["text"]


def test_logit_bias_bans_and_forces_tokens(server: RunningServer) -> None:
    """OpenAI's logit_bias: -100 keeps the greedy choice out, +100 forces a token."""
    body = {**GREEDY, "prompt": "The capital of France is", "max_tokens": 3, "logprobs": 0}
    first = _complete(server.url, body)["choices"][0]["logprobs"]["tokens"][0]
    first_id = httpx.post(
        f"{server.url}/tokenize", json={"prompt": first, "add_special_tokens": False}
    ).json()["tokens"]
    assert len(first_id) == 1
    banned = _complete(server.url, {**body, "logit_bias": {str(first_id[0]): -100}})
    assert banned["choices"][0]["logprobs"]["tokens"][0] != first
    forced_id = httpx.post(
        f"{server.url}/tokenize", json={"prompt": " banana", "add_special_tokens": False}
    ).json()["tokens"]
    forced = _complete(
        server.url,
        {**body, "temperature": 1.0, "seed": 2, "logit_bias": {str(forced_id[0]): 100}},
    )
    assert forced["choices"][0]["logprobs"]["tokens"] == [" banana"] * 3


def test_frequency_and_repetition_penalties_break_a_greedy_loop(server: RunningServer) -> None:
    """A prompt greedy decoding repeats from: each penalty makes its most repeated token
    rarer than without it (the penalties count the tokens the request has seen). A
    presence penalty of 2 does not break this loop, whose margins are wider (the sampler's
    unit test covers it)."""
    body = {**GREEDY, "prompt": "1, 1, 1, 1, 1, 1, 1, 1,", "max_tokens": 16, "ignore_eos": True}

    def most_repeated(extra: dict[str, object]) -> int:
        tokens = _complete(server.url, {**body, "logprobs": 0, **extra})["choices"][0]
        counts: dict[str, int] = {}
        for token in tokens["logprobs"]["tokens"]:
            counts[token] = counts.get(token, 0) + 1
        return max(counts.values())

    plain = most_repeated({})
    assert plain >= 6  # the loop the penalties are there to break
    assert most_repeated({"frequency_penalty": 2.0}) < plain
    assert most_repeated({"repetition_penalty": 2.0}) < plain


def test_stop_token_ids_end_the_output_on_the_token(server: RunningServer) -> None:
    """vLLM's stop_token_ids: the output ends with the first stop token generated, which it
    keeps (it is no special token), finish_reason "stop"; not before min_tokens."""
    body = {**GREEDY, "prompt": "Count: 1, 2, 3,", "max_tokens": 12, "ignore_eos": True}
    plain = _complete(server.url, body)["choices"][0]["text"]
    assert plain.count(",") >= 2
    comma = httpx.post(
        f"{server.url}/tokenize", json={"prompt": ",", "add_special_tokens": False}
    ).json()["tokens"]
    stopped = _complete(server.url, {**body, "stop_token_ids": comma})["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == plain[: plain.index(",") + 1]
    later = _complete(server.url, {**body, "stop_token_ids": comma, "min_tokens": 6})
    assert len(later["choices"][0]["text"]) > len(stopped["text"])


def test_openai_client_chat_and_completions(server: RunningServer) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    completion = client.completions.create(model=MODEL, prompt="Hi", max_tokens=6, temperature=0)
    assert completion.choices[0].text
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chunks[-1].usage is not None
    stream = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == completion.choices[0].text


def test_32_concurrent_streams_all_complete(server: RunningServer) -> None:
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    before = metric(server.url, "tokenpace:request_success_total")

    async def one(i: int) -> str | None:
        stream = await client.completions.create(
            model=MODEL, prompt=f"Story {i}:", max_tokens=4, temperature=0, stream=True
        )
        reason = None
        async for chunk in stream:
            reason = chunk.choices[0].finish_reason or reason
        return reason

    async def run() -> list[str | None]:
        return await asyncio.gather(*(one(i) for i in range(32)))

    reasons = asyncio.run(run())
    assert all(r in ("stop", "length") for r in reasons)
    assert metric(server.url, "tokenpace:request_success_total") - before == 32


def _complete(url: str, body: dict[str, object]) -> dict[str, Any]:
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


def test_a_batch_of_prompts_gets_one_choice_per_prompt_in_order(server: RunningServer) -> None:
    prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"]
    alone = [_complete(server.url, {**GREEDY, "prompt": p}) for p in prompts]
    batch = _complete(server.url, {**GREEDY, "prompt": prompts, "echo": True})
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    for choice, prompt in zip(batch["choices"], prompts, strict=True):
        assert choice["text"].startswith(prompt) and len(choice["text"]) > len(prompt)
    assert batch["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    # Token-id lists, as evaluation harnesses send them: each choice echoes its own ids.
    ids = [
        httpx.post(f"{server.url}/tokenize", json={"prompt": p}).json()["tokens"] for p in prompts
    ]
    by_ids = _complete(server.url, {**GREEDY, "prompt": ids, "echo": True})
    for choice, prompt in zip(by_ids["choices"], prompts, strict=True):
        assert choice["text"].startswith(prompt)
    assert by_ids["usage"]["prompt_tokens"] == batch["usage"]["prompt_tokens"]


def test_n_samples_per_prompt_are_indexed_prompt_times_n_plus_sample(
    server: RunningServer,
) -> None:
    sampled = {"model": MODEL, "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    prompts = ["Hello", "The weather today"]
    body = {**sampled, "prompt": prompts, "n": 2, "seed": 11, "echo": True}
    both = _complete(server.url, body)
    assert [c["index"] for c in both["choices"]] == [0, 1, 2, 3]
    texts = [c["text"] for c in both["choices"]]
    for index, text in enumerate(texts):
        assert text.startswith(prompts[index // 2])
    # Each sample draws from its own seed (seed + sample), reproducibly.
    assert texts[0] != texts[1] or texts[2] != texts[3]
    assert [c["text"] for c in _complete(server.url, body)["choices"]] == texts
    prompt_tokens = sum(
        _complete(server.url, {**GREEDY, "prompt": p, "max_tokens": 1})["usage"]["prompt_tokens"]
        for p in prompts
    )
    assert both["usage"]["prompt_tokens"] == prompt_tokens  # once per prompt, not per sample
    assert both["usage"]["completion_tokens"] == 4 * 6


def test_streamed_choices_carry_their_index_and_equal_the_whole_response(
    server: RunningServer,
) -> None:
    for path, extra, chat in (
        ("completions", {"prompt": ["Once upon a time", "Hello"]}, False),
        ("chat/completions", {"messages": [{"role": "user", "content": "Say hi"}]}, True),
    ):
        body = {**GREEDY, **extra, "n": 2}
        whole = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=120).json()
        streamed = httpx.post(
            f"{server.url}/v1/{path}",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            timeout=120,
        )
        payloads = sse_payloads(streamed.text)
        assert payloads[-1] == "[DONE]"
        assert json.loads(payloads[-2])["usage"] == whole["usage"]
        texts: dict[int, str] = {}
        reasons: dict[int, str] = {}
        for payload in payloads[:-2]:
            for choice in json.loads(payload)["choices"]:
                index = choice["index"]
                delta = (choice["delta"].get("content") or "") if chat else choice["text"]
                texts[index] = texts.get(index, "") + delta
                if choice["finish_reason"]:
                    reasons[index] = choice["finish_reason"]
        expected = {
            c["index"]: c["message"]["content"] if chat else c["text"] for c in whole["choices"]
        }
        assert len(expected) == (4 if not chat else 2)
        assert texts == expected
        assert reasons == {c["index"]: c["finish_reason"] for c in whole["choices"]}


def test_an_evaluation_harness_loglikelihood_request_is_answered(server: RunningServer) -> None:
    """The body lm-evaluation-harness's local-completions model sends to score a
    continuation: token ids in a batch, echo, one logprob, one token."""
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": "The sky is blue"}).json()["tokens"]
    prompts = [ids, ids[:-1]]
    body = {
        "model": MODEL,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    data = _complete(server.url, body)
    for choice, prompt in zip(data["choices"], prompts, strict=True):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + 1
        assert logprobs["token_logprobs"][0] is None
        assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    # The shorter prompt's scores are the longer one's, position by position.
    short, long = (c["logprobs"]["token_logprobs"] for c in data["choices"][::-1])
    assert long[1 : len(ids) - 1] == pytest.approx(short[1 : len(ids) - 1], abs=0.05)

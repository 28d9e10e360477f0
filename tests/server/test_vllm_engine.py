"""``--engine vllm``: vLLM V1 with the TWP scheduler behind the same OpenAI API."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, vllm_server_settings
from tests.server.helpers import MODEL, metric

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (setup.sh vllm)"
    ),
]


@pytest.fixture(scope="module")
def vllm_server(native_profile: str) -> Iterator[RunningServer]:
    running = start_server(**vllm_server_settings(native_profile))
    yield running
    running.stop()


def test_streamed_and_whole_greedy_completions_agree(vllm_server: RunningServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused")
    kwargs = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12}
    whole = client.completions.create(temperature=0, **kwargs)  # type: ignore[call-overload]
    pieces = client.completions.create(temperature=0, stream=True, **kwargs)  # type: ignore[call-overload]
    streamed = "".join(chunk.choices[0].text for chunk in pieces if chunk.choices)
    assert whole.choices[0].text == streamed
    assert whole.usage.completion_tokens == 12 or whole.choices[0].finish_reason == "stop"


def test_chat_stream_under_twp(vllm_server: RunningServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{vllm_server.url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # TWP runs inside vLLM's scheduler: its window is exported for the container.
    assert metric(vllm_server.url, "tokenpace:twp_token_window") > 0
    health = httpx.get(f"{vllm_server.url}/health").json()
    assert health["containers"][0]["num_used_blocks"] == 0


def test_logprobs_and_echo_match_a_forward_pass(vllm_server: RunningServer) -> None:
    from tests.server.reference_model import Reference, close

    reference = Reference.of(vllm_server)
    ids = httpx.post(f"{vllm_server.url}/tokenize", json={"prompt": "The sea is"}).json()["tokens"]
    body = {"model": MODEL, "prompt": ids, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    answer = httpx.post(
        f"{vllm_server.url}/v1/completions", json={**body, "logprobs": 2, "echo": True}, timeout=120
    ).json()
    lp = answer["choices"][0]["logprobs"]
    dtype = reference.dtype
    expected = reference.logprobs(ids)
    assert lp["tokens"][: len(ids)] == [reference.text(t) for t in ids]
    assert lp["token_logprobs"][0] is None
    for position in range(1, len(ids)):
        row = expected[position - 1]
        assert close(lp["token_logprobs"][position], float(row[ids[position]]), dtype)
        # The two largest values of the position (its top 2; the chosen token may be extra).
        served = sorted(lp["top_logprobs"][position].values(), reverse=True)[:2]
        for got, value in zip(served, row.topk(2).values.tolist(), strict=True):
            assert close(got, value, dtype)
    # The first output token: greedy, so the most likely one, with its logprob.
    first = expected[-1]
    assert lp["tokens"][len(ids)] == reference.text(int(first.argmax()))
    assert close(lp["token_logprobs"][len(ids)], float(first.max()), dtype)
    assert len(lp["tokens"]) == len(ids) + 3


def test_a_batch_with_several_samples_each_through_vllm(vllm_server: RunningServer) -> None:
    """Each choice is a vLLM request of its own, numbered prompt * n + sample; seeded
    samples draw from seed + sample, so two samples of one prompt differ."""
    prompts = ["Once upon a time", "The weather today"]
    body = {
        "model": MODEL,
        "prompt": prompts,
        "n": 2,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 5,
        "ignore_eos": True,
        "echo": True,
    }
    response = httpx.post(f"{vllm_server.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    data = response.json()
    choices = data["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for choice in choices:
        assert choice["text"].startswith(prompts[choice["index"] // 2])
    assert choices[0]["text"] != choices[1]["text"] or choices[2]["text"] != choices[3]["text"]
    assert data["usage"]["completion_tokens"] == 4 * 6


def test_top_k_of_one_is_greedy_and_logit_bias_forces_through_vllm(
    vllm_server: RunningServer,
) -> None:
    url = f"{vllm_server.url}/v1/completions"
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6}
    greedy = httpx.post(url, json={**body, "temperature": 0}, timeout=120).json()
    sampled = httpx.post(
        url, json={**body, "temperature": 1.5, "seed": 9, "top_k": 1, "min_p": 0.5}, timeout=120
    ).json()
    assert sampled["choices"][0]["text"] == greedy["choices"][0]["text"]
    banana = httpx.post(
        f"{vllm_server.url}/tokenize", json={"prompt": " banana", "add_special_tokens": False}
    ).json()["tokens"]
    forced = httpx.post(
        url, json={**body, "max_tokens": 3, "logit_bias": {str(banana[0]): 100}}, timeout=120
    ).json()
    assert forced["choices"][0]["text"] == " banana" * 3


def test_a_frequency_penalty_through_vllm_breaks_a_greedy_loop(vllm_server: RunningServer) -> None:
    url = f"{vllm_server.url}/v1/completions"
    body = {
        "model": MODEL,
        "prompt": "1, 1, 1, 1, 1, 1, 1, 1,",
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
    plain = httpx.post(url, json=body, timeout=120).json()["choices"][0]["text"]
    penalised = httpx.post(url, json={**body, "frequency_penalty": 2.0}, timeout=120).json()
    assert plain.count("1") > penalised["choices"][0]["text"].count("1")


def test_stop_token_ids_through_vllm(vllm_server: RunningServer) -> None:
    url = f"{vllm_server.url}/v1/completions"
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 12, "temperature": 0}
    plain = httpx.post(url, json={**body, "ignore_eos": True}, timeout=120).json()
    comma = httpx.post(
        f"{vllm_server.url}/tokenize", json={"prompt": ",", "add_special_tokens": False}
    ).json()["tokens"]
    stopped = httpx.post(
        url, json={**body, "ignore_eos": True, "stop_token_ids": comma}, timeout=120
    ).json()["choices"][0]
    text = plain["choices"][0]["text"]
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == text[: text.index(",") + 1]

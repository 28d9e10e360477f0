"""Bad input gets an OpenAI-style 400/401/404 naming the field; overload gets 429."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.server.conftest import API_KEY, RunningServer
from tests.server.helpers import MODEL, wait_until_idle

pytestmark = pytest.mark.slow

CASES = [
    ("completions", b"{not json", None),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": -3}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ("completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
    ("completions", {"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ("completions", {"model": MODEL, "prompt": "x", "top_k": -2}, "top_k"),
    ("completions", {"model": MODEL, "prompt": "x", "min_p": 1.5}, "min_p"),
    ("completions", {"model": MODEL, "prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids"),
    ("completions", {"model": MODEL, "prompt": "x", "stop_token_ids": ["a"]}, "stop_token_ids"),
    ("completions", {"model": MODEL, "prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ("completions", {"model": MODEL, "prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ("completions", {"model": MODEL, "prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ("completions", {"model": MODEL, "prompt": "x", "repetition_penalty": 1e-9}, "repetition"),
    ("completions", {"model": MODEL, "prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("completions", {"model": MODEL, "prompt": "x", "logit_bias": {"-1": 1}}, "logit_bias"),
    ("completions", {"model": MODEL, "prompt": "x", "logit_bias": {"10000000": 1}}, "logit_bias"),
    ("completions", {"model": MODEL, "prompt": "x", "logit_bias": {"1": 500}}, "logit_bias"),
    ("completions", {"model": MODEL, "prompt": "x", "n": 0}, "n"),
    ("completions", {"model": MODEL, "prompt": "x", "n": 129}, "n"),
    ("completions", {"model": MODEL, "prompt": ["x", "y"], "n": 100}, "n"),
    ("completions", {"model": MODEL, "prompt": ["x", ""]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": [[1, 2], []]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": [[1, 2], [10**9]]}, "prompt"),
    ("completions", {"model": MODEL, "prompt": ["x"] * 129}, "prompt"),
    ("completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    ("completions", {"model": MODEL}, "prompt"),
    ("completions", {"model": MODEL, "prompt": ""}, "prompt"),
    ("completions", {"model": MODEL, "prompt": []}, "prompt"),
    ("completions", {"model": MODEL, "prompt": 12}, "prompt"),
    ("completions", {"model": MODEL, "prompt": "hello " * 3000}, "prompt"),
    ("completions", [1, 2], None),
    ("chat/completions", {"model": MODEL}, "messages"),
    ("chat/completions", {"model": MODEL, "messages": []}, "messages"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user"}]}, "messages"),
    ("chat/completions", {"model": MODEL, "messages": "hi"}, "messages"),
    (
        "chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi " * 3000}]},
        "messages",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), CASES)
def test_bad_input_is_400_naming_the_field(
    server: RunningServer, path: str, body: object, param: str | None
) -> None:
    url = f"{server.url}/v1/{path}"
    if isinstance(body, bytes):
        response = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(url, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param)


def test_a_request_without_model_is_served_by_the_served_model(server: RunningServer) -> None:
    """vLLM's server lets clients leave ``model`` out; OpenAI's API requires it."""
    for path, extra in (
        ("completions", {"prompt": "Hello"}),
        ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ):
        body = {**extra, "max_tokens": 2, "temperature": 0}
        response = httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == MODEL


def test_unknown_model_is_404(server: RunningServer) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["param"] == "model"


def test_api_key_is_required(guarded_server: RunningServer) -> None:
    url = f"{guarded_server.url}/v1/models"
    assert httpx.get(url).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
    assert httpx.get(f"{guarded_server.url}/health").status_code == 200


def test_full_admission_queue_is_429_with_retry_after(guarded_server: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 4, "temperature": 0}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=guarded_server.url, timeout=120) as client:
            return await asyncio.gather(
                *(client.post("/v1/completions", json=body, headers=headers) for _ in range(16))
            )

    responses = asyncio.run(run())
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}
    assert 200 in codes and 429 in codes
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["Retry-After"]) >= 1
    assert rejected.json()["error"]["type"] == "rate_limit_error"


def test_a_request_whose_later_choice_is_refused_is_429_and_leaves_nothing_running(
    guarded_server: RunningServer,
) -> None:
    """The guarded server queues one request: two choices cannot both be admitted, so the
    whole request is refused and its first choice, already submitted, is aborted."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    url = f"{guarded_server.url}/v1/completions"
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 64, "temperature": 0}
    refused = httpx.post(url, json={**body, "n": 2}, headers=headers, timeout=120)
    assert refused.status_code == 429, refused.text
    assert int(refused.headers["Retry-After"]) >= 1
    idle = wait_until_idle(guarded_server.url)
    assert not any(c["num_running"] or c["num_waiting"] for c in idle["containers"])
    served = httpx.post(url, json={**body, "max_tokens": 4}, headers=headers, timeout=120)
    assert served.status_code == 200, served.text

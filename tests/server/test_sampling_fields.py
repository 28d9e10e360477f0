"""``sampling_params``: a body's sampling fields as ``SamplingParams``, checked against the
vocabulary and against each other."""

from __future__ import annotations

from typing import Any

import pytest

from tokenpace.server.errors import ApiError
from tokenpace.server.sampling_fields import sampling_params
from tokenpace.server.schemas import CompletionRequest

VOCAB = 100


def body(**fields: Any) -> CompletionRequest:
    return CompletionRequest.model_validate({"prompt": "x", **fields})


def test_every_sampling_field_reaches_the_engine() -> None:
    fields = {
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.1,
        "logit_bias": {"5": -100, " 7": 2}, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.2, "stop_token_ids": [3, 4], "seed": 11, "stop": ["\n"],
        "ignore_eos": True, "min_tokens": 2, "logprobs": 1, "echo": True,
    }  # fmt: skip
    params = sampling_params(body(**fields), max_tokens=8, vocab=VOCAB)
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 0, 0.1)
    assert params.logit_bias == ((5, -100.0), (7, 2.0))
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -0.5)
    assert params.repetition_penalty == 1.2 and params.stop_token_ids == (3, 4)
    assert (params.seed, params.stop) == (11, ("\n",))
    assert params.ignore_eos and params.min_tokens == 2
    assert (params.logprobs, params.prompt_logprobs) == (1, 1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"100": 1}}, "logit_bias"),
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"min_tokens": 9}, "min_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_what_needs_the_vocabulary_or_two_fields_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(ApiError) as raised:
        sampling_params(body(**fields), max_tokens=8, vocab=VOCAB)
    assert raised.value.status == 400 and raised.value.param == param

"""Sampling: greedy argmax, top-p cut, per-token seeds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")

from tokenpace.core.sampling import SamplingParams, token_seed  # noqa: E402
from tokenpace.engine.native.sampler import sample  # noqa: E402

pytestmark = pytest.mark.native


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(), seed=0, output_index=0) == 1


def test_tiny_top_p_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([0.0, 1.0, 0.9, 0.8])
    params = SamplingParams(temperature=2.0, top_p=0.01)
    assert {sample(logits, params, seed=s, output_index=0) for s in range(20)} == {1}


def test_sampling_depends_only_on_seed_and_index() -> None:
    logits = torch.zeros(1000)
    params = SamplingParams(temperature=1.0)
    first = [sample(logits, params, seed=3, output_index=i) for i in range(8)]
    assert first == [sample(logits, params, seed=3, output_index=i) for i in range(8)]
    assert first != [sample(logits, params, seed=4, output_index=i) for i in range(8)]
    assert token_seed(3, 0) != token_seed(3, 1)

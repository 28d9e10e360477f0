"""Sampling: greedy argmax, min-p, top-k and top-p cuts, per-token seeds."""

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


def test_top_k_keeps_the_k_most_likely_tokens() -> None:
    logits = torch.tensor([0.0, 1.0, 0.9, 0.8, 0.7])
    chosen = {
        sample(logits, SamplingParams(temperature=5.0, top_k=2), seed=s, output_index=0)
        for s in range(200)
    }
    assert chosen == {1, 2}
    flat = {sample(logits, SamplingParams(temperature=5.0), s, 0) for s in range(200)}
    assert flat == {0, 1, 2, 3, 4}  # without the cut every token is drawn
    assert {sample(logits, SamplingParams(temperature=5.0, top_k=1), s, 0) for s in range(20)} == {
        1
    }


def test_min_p_drops_tokens_far_less_likely_than_the_best() -> None:
    # At T = 1 the probabilities relative to the best are 1, e^-0.5, e^-3 and e^-4.
    logits = torch.tensor([4.0, 3.5, 1.0, 0.0])
    params = SamplingParams(temperature=1.0, min_p=0.1)
    assert {sample(logits, params, seed=s, output_index=0) for s in range(300)} == {0, 1}


def test_top_p_is_a_share_of_what_top_k_left() -> None:
    """As vLLM cuts them: top-k first, then top-p over the renormalised rest. Of the two
    tokens top-k keeps (0.5 and 0.3 of the whole), top-p 0.6 keeps the first alone; over
    the whole distribution it would keep both."""
    probs = torch.tensor([0.5, 0.3, 0.1, 0.1])
    logits = probs.log()
    both = SamplingParams(temperature=1.0, top_k=2, top_p=0.6)
    assert {sample(logits, both, seed=s, output_index=0) for s in range(100)} == {0}
    alone = SamplingParams(temperature=1.0, top_p=0.6)
    assert {sample(logits, alone, seed=s, output_index=0) for s in range(100)} == {0, 1}


def test_logit_bias_bans_and_forces_tokens_greedy_or_sampled() -> None:
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    banned_best = SamplingParams(logit_bias=((1, -100.0),))
    assert sample(logits, banned_best, seed=0, output_index=0) == 2
    forced = SamplingParams(temperature=1.0, logit_bias=((3, 100.0),))
    assert {sample(logits, forced, seed=s, output_index=0) for s in range(50)} == {3}
    assert logits[3] == -1.0  # the caller's logits are left as they were


def test_sampling_depends_only_on_seed_and_index() -> None:
    logits = torch.zeros(1000)
    params = SamplingParams(temperature=1.0)
    first = [sample(logits, params, seed=3, output_index=i) for i in range(8)]
    assert first == [sample(logits, params, seed=3, output_index=i) for i in range(8)]
    assert first != [sample(logits, params, seed=4, output_index=i) for i in range(8)]
    assert token_seed(3, 0) != token_seed(3, 1)


def test_banned_tokens_are_never_chosen() -> None:
    logits = torch.tensor([0.1, 9.0, 2.9, -1.0])
    assert sample(logits, SamplingParams(), 0, 0, banned=frozenset({1})) == 2
    sampled = {
        sample(logits, SamplingParams(temperature=1.0), s, 0, banned=frozenset({1}))
        for s in range(30)
    }
    assert 1 not in sampled


def test_token_logprobs_are_the_log_softmax_and_its_top_k() -> None:
    from tokenpace.engine.native.logprobs import token_logprobs

    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    entries = token_logprobs(logits, [2, 0], num_top=2)
    expected = torch.log_softmax(logits, dim=-1)
    assert entries[0].token_id == 2
    assert entries[0].logprob == pytest.approx(float(expected[0, 2]))
    assert [t for t, _ in entries[0].top] == [1, 2]
    assert entries[1].top[0][0] == 3
    assert entries[1].top[0][1] == pytest.approx(float(expected[1, 3]))
    assert token_logprobs(logits, [0, 1], num_top=0)[1].top == ()

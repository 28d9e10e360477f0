"""Sampling: greedy argmax, min-p, top-k and top-p cuts, per-token seeds."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")

from tokenpace.core.sampling import SamplingParams, token_seed  # noqa: E402
from tokenpace.engine.native.sampler import TokenHistory, penalised, sample  # noqa: E402

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


def test_penalties_as_openai_and_vllm_define_them() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    history = TokenHistory(prompt=[0, 1], output=[3, 3, 2])
    frequency = penalised(logits, SamplingParams(frequency_penalty=0.5), history)
    assert frequency.tolist() == [2.0, -1.0, 0.0, 2.0]  # once per output occurrence
    presence = penalised(logits, SamplingParams(presence_penalty=0.5), history)
    assert presence.tolist() == [2.0, -1.0, 0.0, 2.5]  # once for any occurrence
    repetition = penalised(logits, SamplingParams(repetition_penalty=2.0), history)
    assert repetition.tolist() == [1.0, -2.0, 0.25, 1.5]  # prompt and output, both signs
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0]
    # Greedy honours them: token 3 leads, until its repeats cost more than its lead.
    params = SamplingParams(frequency_penalty=0.75)
    assert sample(logits, params, 0, 0, history=TokenHistory([], [3])) == 3
    assert sample(logits, params, 0, 0, history=history) == 0
    with pytest.raises(ValueError, match="history"):
        sample(logits, params, 0, 0)


def test_a_moved_requests_history_splits_its_earlier_outputs_off_the_prompt() -> None:
    """After a move the outputs delivered so far end the prompt (first_output_index of
    them); the penalties still count them as outputs."""
    history = TokenHistory.of([5, 6, 7, 8, 9], [10], first_output_index=2)
    assert list(history.prompt) == [5, 6, 7]
    assert list(history.output) == [8, 9, 10]


def test_extreme_settings_still_choose_a_token() -> None:
    """A top_p below float32's smallest value keeps the most likely token; a temperature
    too small to divide by samples greedily, as vLLM treats it."""
    logits = torch.tensor([0.0, 1.0, 0.9, 0.8])
    tiny_p = SamplingParams(temperature=1.0, top_p=5e-324)
    assert {sample(logits, tiny_p, seed=s, output_index=0) for s in range(10)} == {1}
    tiny_t = SamplingParams(temperature=5e-324)
    assert tiny_t.is_greedy and not SamplingParams(temperature=0.01).is_greedy
    assert sample(logits, tiny_t, seed=0, output_index=0) == 1


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

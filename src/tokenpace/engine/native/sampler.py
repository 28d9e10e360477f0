"""Next-token choice per request: the logits biased and penalised as the request asks, then
greedy, or temperature with min-p, top-k and top-p cuts and a reproducible seed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tokenpace.core.sampling import SamplingParams, token_seed


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """The tokens a request's penalties look at: its prompt as the client sent it, and
    every output token so far (those generated before a move included)."""

    prompt: Sequence[int]
    output: Sequence[int]

    @staticmethod
    def of(
        prompt_token_ids: Sequence[int], output_token_ids: Sequence[int], first_output_index: int
    ) -> TokenHistory:
        """The history of a request whose first ``first_output_index`` outputs were
        generated before a move and now end its prompt."""
        split = len(prompt_token_ids) - first_output_index
        earlier = list(prompt_token_ids[split:])
        return TokenHistory(prompt_token_ids[:split], [*earlier, *output_token_ids])


def penalised(logits: torch.Tensor, params: SamplingParams, history: TokenHistory) -> torch.Tensor:
    """``logits`` (a copy) with the request's repetition, frequency and presence penalties
    applied (``SamplingParams`` defines them)."""
    logits = logits.clone()
    vocab = logits.numel()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({*history.prompt, *history.output}), dtype=torch.long)
        if seen.numel():
            values = logits[seen]
            logits[seen] = torch.where(
                values > 0, values / params.repetition_penalty, values * params.repetition_penalty
            )
    if (params.frequency_penalty or params.presence_penalty) and len(history.output):
        counts = torch.bincount(
            torch.tensor(list(history.output), dtype=torch.long), minlength=vocab
        )[:vocab].to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    seed: int,
    output_index: int,
    banned: frozenset[int] = frozenset(),
    history: TokenHistory | None = None,
) -> int:
    """Choose the next token from ``logits`` (``[vocab]``, float32, CPU) plus the request's
    ``logit_bias`` and its penalties over ``history`` (required when it has any), never one
    of ``banned`` (EOS before ``min_tokens``).

    A greedy request (``params.is_greedy``) takes the argmax (the first of equal maxima;
    numpy's, which on a CPU row of this size costs a fraction of torch's). Otherwise the
    distribution ``softmax(logits / T)`` loses the tokens less likely than ``min_p`` times
    the most likely one, keeps the ``top_k`` most likely (0: all), is cut to the smallest
    set of most likely tokens whose mass reaches ``top_p`` (of what is left), and is
    sampled with a generator seeded by ``token_seed(seed, output_index)``."""
    if params.logit_bias or banned:
        logits = logits.clone()
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        logits[list(ids)] += torch.tensor(biases, dtype=logits.dtype)
    if params.has_penalties:
        if history is None:
            raise ValueError("a request with penalties needs its token history")
        logits = penalised(logits, params, history)
    if banned:
        logits[sorted(banned)] = float("-inf")
    if params.is_greedy:
        return int(logits.numpy().argmax())
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.min_p > 0:
        probs = torch.where(probs < params.min_p * probs.max(), 0.0, probs)
    cut_k = 0 < params.top_k < probs.numel()
    if cut_k or params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        if cut_k:
            sorted_probs[params.top_k :] = 0.0
        if params.top_p < 1.0:
            # top_p is a share of the mass the earlier cuts left.
            kept = float(sorted_probs.sum()) if cut_k or params.min_p > 0 else 1.0
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            cut = mass_before >= params.top_p * kept
            # The most likely token always stays: a top_p below float32's smallest value
            # would otherwise round to 0 and cut every token.
            cut[0] = False
            sorted_probs[cut] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(token_seed(seed, output_index))
    return int(torch.multinomial(probs, 1, generator=generator).item())

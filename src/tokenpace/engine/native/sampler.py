"""Next-token choice per request: greedy, or temperature with min-p, top-k and top-p cuts
and a reproducible seed."""

from __future__ import annotations

import torch

from tokenpace.core.sampling import SamplingParams, token_seed


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    seed: int,
    output_index: int,
    banned: frozenset[int] = frozenset(),
) -> int:
    """Choose the next token from ``logits`` (``[vocab]``, float32, CPU) plus the request's
    ``logit_bias``, never one of ``banned`` (EOS before ``min_tokens``).

    ``temperature == 0`` is argmax (the first of equal maxima; numpy's, which on a CPU row
    of this size costs a fraction of torch's). Otherwise the distribution
    ``softmax(logits / T)`` loses the tokens less likely than ``min_p`` times the most
    likely one, keeps the ``top_k`` most likely (0: all), is cut to the smallest set of most
    likely tokens whose mass reaches ``top_p`` (of what is left), and is sampled with a
    generator seeded by ``token_seed(seed, output_index)``."""
    if params.logit_bias or banned:
        logits = logits.clone()
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias, strict=True)
        logits[list(ids)] += torch.tensor(biases, dtype=logits.dtype)
    if banned:
        logits[sorted(banned)] = float("-inf")
    if params.temperature == 0:
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
            sorted_probs[mass_before >= params.top_p * kept] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(token_seed(seed, output_index))
    return int(torch.multinomial(probs, 1, generator=generator).item())

"""Next-token choice per request: greedy, or temperature + top-p with a reproducible seed."""

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
    """Choose the next token from ``logits`` (``[vocab]``, float32, CPU), never one of
    ``banned`` (EOS before ``min_tokens``).

    ``temperature == 0`` is argmax (the first of equal maxima; numpy's, which on a CPU row
    of this size costs a fraction of torch's). Otherwise the distribution
    ``softmax(logits / T)`` is cut to the smallest set of most likely tokens whose mass
    reaches ``top_p`` and sampled with a generator seeded by
    ``token_seed(seed, output_index)``."""
    if banned:
        logits = logits.clone()
        logits[sorted(banned)] = float("-inf")
    if params.temperature == 0:
        return int(logits.numpy().argmax())
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[mass_before >= params.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(token_seed(seed, output_index))
    return int(torch.multinomial(probs, 1, generator=generator).item())

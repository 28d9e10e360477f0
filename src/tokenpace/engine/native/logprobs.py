"""Log-probabilities of chosen tokens and their most likely alternatives, from logits."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenpace.core.logprobs import LOGPROB_FLOOR, TokenLogprob


def token_logprobs(
    logits: torch.Tensor, token_ids: Sequence[int], num_top: int
) -> list[TokenLogprob]:
    """One ``TokenLogprob`` per row of ``logits`` (``[rows, vocab]``, float32): the
    log-softmax value of ``token_ids[row]`` and the ``num_top`` largest values of the row.
    Values below ``LOGPROB_FLOOR`` are reported as the floor (JSON has no -inf)."""
    if len(token_ids) != logits.shape[0]:
        raise ValueError(f"{len(token_ids)} token ids for {logits.shape[0]} rows of logits")
    if not token_ids:
        return []
    logp = torch.log_softmax(logits.float(), dim=-1).clamp_(min=LOGPROB_FLOOR)
    chosen = logp.gather(1, torch.tensor(list(token_ids), dtype=torch.long)[:, None])[:, 0]
    top_values, top_ids = (
        torch.topk(logp, num_top, dim=-1) if num_top > 0 else (logp[:, :0], logp[:, :0].long())
    )
    return [
        TokenLogprob(
            int(token_ids[row]),
            float(chosen[row]),
            tuple(zip(top_ids[row].tolist(), top_values[row].tolist(), strict=True)),
        )
        for row in range(len(token_ids))
    ]

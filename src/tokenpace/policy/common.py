"""Mechanics several policies share: how many tokens each active request computes."""

from __future__ import annotations

from collections.abc import Iterable

from tokenpace.core.request import Request

UNCHUNKED = 1 << 62


def schedule_tokens(requests: Iterable[Request], chunk_tokens: int) -> dict[int, int]:
    """One token for each decoding request; up to ``chunk_tokens`` of the uncomputed tokens
    for each request still prefilling (``UNCHUNKED`` feeds the whole prompt at once)."""
    scheduled: dict[int, int] = {}
    for r in requests:
        # Inlined num_uncomputed_tokens: this runs for every active request every step.
        uncomputed = r.num_prompt_tokens + len(r.token_times_s) - r.num_computed_tokens
        scheduled[r.request_id] = uncomputed if uncomputed <= 1 else min(uncomputed, chunk_tokens)
    return scheduled


def kv_blocks_in_use(num_total_blocks: int, num_free_blocks: int) -> int:
    return num_total_blocks - num_free_blocks

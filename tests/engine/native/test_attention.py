"""The native engine's step attention against attention written out row by row: decode rows,
a fresh prefill chunk, short and long continuation chunks in one step, so both ways of
writing KV (the step's indexed write and a chunk's own slice) are exercised."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")

from tokenpace.engine.native.attention import (  # noqa: E402
    INDEXED_WRITE_MAX_TOKENS,
    PrefillSpan,
    StepLayout,
    attend,
)
from tokenpace.engine.native.kv_cache import KVShape, SlotKVCache  # noqa: E402

pytestmark = pytest.mark.native

Q_HEADS, KV_HEADS, DIM = 4, 2, 8


def reference(q: Any, keys: Any, values: Any, slot: int, pos: int) -> Any:
    """One row's attention over positions 0 .. pos of ``slot`` (query heads share KV heads
    in groups)."""
    group = Q_HEADS // KV_HEADS
    out = torch.empty(Q_HEADS, DIM)
    for h in range(Q_HEADS):
        k = keys[slot, h // group, : pos + 1]
        v = values[slot, h // group, : pos + 1]
        weights = torch.softmax(k @ q[h] / DIM**0.5, dim=0)
        out[h] = weights @ v
    return out


@pytest.mark.parametrize("peel", [False, True], ids=["padded", "longest-peeled"])
def test_step_attention_writes_kv_and_attends_like_the_row_by_row_reference(peel: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    cache = SlotKVCache(KVShape(1, KV_HEADS, DIM), torch.float32, torch.device("cpu"), 8, 128)
    # (slot, context already cached, new tokens): two decodes, a fresh chunk, a short and
    # a long continuation (the long one writes by slice).
    decodes = [(0, 10), (1, 5)]
    chunks = [(2, 0, 4), (3, 20, INDEXED_WRITE_MAX_TOKENS + 8), (4, 12, 6)]
    for request_id in range(5):
        cache.assign(request_id)
    cache.ensure(5, 64)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    rows = [(slot, context) for slot, context in decodes]
    spans, write = [], [(r, s, p) for r, (s, p) in enumerate(rows)]
    for slot, start, n in chunks:
        span = PrefillSpan.of(len(rows), n, slot, start, torch.device("cpu"))
        spans.append(span)
        if not span.write_by_slice:
            write += [(len(rows) + i, slot, start + i) for i in range(n)]
        rows += [(slot, start + i) for i in range(n)]
    assert [s.write_by_slice for s in spans] == [False, True, False]
    layout = StepLayout(
        cache=cache,
        decode_slots=torch.tensor([s for s, _ in decodes]),
        decode_positions=torch.tensor([p for _, p in decodes]),
        # Peeled, the longest decode (11 keys) is attended on its own and the padded call
        # stops at the other's 6 keys.
        decode_visible=torch.arange(6 if peel else 11)[None, :] <= torch.tensor([10, 5])[:, None],
        decode_max_len=6 if peel else 11,
        decode_peeled=((0, 0, 11),) if peel else (),
        decode_is_dense=True,
        prefills=tuple(spans),
        write_rows=torch.tensor([r for r, _, _ in write]),
        write_slots=torch.tensor([s for _, s, _ in write]),
        write_positions=torch.tensor([p for _, _, p in write]),
    )
    q = torch.randn(len(rows), Q_HEADS, DIM, generator=gen)
    k_new = torch.randn(len(rows), KV_HEADS, DIM, generator=gen)
    v_new = torch.randn(len(rows), KV_HEADS, DIM, generator=gen)
    keys, values = cache.keys[0].clone(), cache.values[0].clone()
    for r, (slot, pos) in enumerate(rows):
        keys[slot, :, pos], values[slot, :, pos] = k_new[r], v_new[r]

    out = attend(0, q, k_new, v_new, layout, DIM**-0.5)

    assert torch.equal(cache.keys[0], keys) and torch.equal(cache.values[0], values)
    for r, (slot, pos) in enumerate(rows):
        torch.testing.assert_close(out[r], reference(q[r], keys, values, slot, pos))

"""The native engine's step attention against attention written out row by row: decode rows,
a fresh prefill chunk, short and long continuation chunks in one step, so both ways of
writing KV (the step's indexed write and a chunk's own slice) are exercised."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")

from tokenpace.engine.native.attention import (  # noqa: E402
    INDEXED_WRITE_MAX_TOKENS,
    PRODUCTS_PROBE_MIN_LEN,
    DecodeShape,
    FreshRun,
    PrefillSpan,
    StepLayout,
    attend,
    measure_one_thread_decode_max_keys,
    measure_products_max_len,
    prefill_calls,
    score_bias,
)
from tokenpace.engine.native.kv_cache import KVShape, SlotKVCache  # noqa: E402

from .conftest import scripted_clock  # noqa: E402

pytestmark = pytest.mark.native

Q_HEADS, KV_HEADS, DIM = 4, 2, 8
# What the decode-attention probes time: 2 KV heads of 2 query heads each, head size 8.
SHAPE = DecodeShape(2, 2, 8)


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


@pytest.mark.parametrize("products", [False, True], ids=["sdpa", "products"])
@pytest.mark.parametrize("peel", [False, True], ids=["padded", "longest-peeled"])
def test_step_attention_writes_kv_and_attends_like_the_row_by_row_reference(
    peel: bool, products: bool
) -> None:
    gen = torch.Generator().manual_seed(0)
    cache = SlotKVCache(KVShape(1, KV_HEADS, DIM), torch.float32, torch.device("cpu"), 8, 128)
    # (slot, context already cached, new tokens): two decodes, three fresh chunks of one
    # length (one batched call), a long and a short continuation (the long one writes by
    # slice), and a fresh chunk as long as the short continuation (a call of its own).
    decodes = [(0, 10), (1, 5)]
    chunks = [
        (2, 0, 4), (5, 0, 4), (6, 0, 4), (3, 20, INDEXED_WRITE_MAX_TOKENS + 8), (4, 12, 6),
        (7, 0, 6),
    ]  # fmt: skip
    for request_id in range(8):
        cache.assign(request_id)
    cache.ensure(8, 64)
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
    assert [s.write_by_slice for s in spans] == [False, False, False, True, False, False]
    # Peeled, the longest decode (11 keys) is attended on its own and the padded call stops
    # at the other's 6 keys.
    visible = torch.arange(6 if peel else 11)[None, :] <= torch.tensor([10, 5])[:, None]
    layout = StepLayout(
        cache=cache,
        decode_slots=torch.tensor([s for s, _ in decodes]),
        decode_positions=torch.tensor([p for _, p in decodes]),
        decode_visible=visible,
        decode_bias=score_bias(visible, KV_HEADS, torch.float32) if products else None,
        decode_max_len=6 if peel else 11,
        decode_peeled=((0, 0, 11),) if peel else (),
        decode_is_dense=True,
        prefills=tuple(spans),
        write_rows=torch.tensor([r for r, _, _ in write]),
        write_slots=torch.tensor([s for _, s, _ in write]),
        write_positions=torch.tensor([p for _, _, p in write]),
    )
    assert layout.prefill_calls == (FreshRun(2, 3, 4), *spans[3:])
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


def test_one_decode_row_that_sees_every_key_attends_unmasked_like_the_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    cache = SlotKVCache(KVShape(1, KV_HEADS, DIM), torch.float32, torch.device("cpu"), 2, 32)
    cache.assign(0)
    cache.ensure(1, 16)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=gen))
    cache.values.copy_(torch.randn(cache.values.shape, generator=gen))
    layout = StepLayout(
        cache=cache,
        decode_slots=torch.tensor([0]),
        decode_positions=torch.tensor([9]),
        decode_visible=torch.ones(1, 10, dtype=torch.bool),
        decode_max_len=10,
        decode_is_dense=True,
        decode_all_visible=True,
        prefills=(),
        write_rows=torch.tensor([0]),
        write_slots=torch.tensor([0]),
        write_positions=torch.tensor([9]),
    )
    q = torch.randn(1, Q_HEADS, DIM, generator=gen)
    k_new = torch.randn(1, KV_HEADS, DIM, generator=gen)
    v_new = torch.randn(1, KV_HEADS, DIM, generator=gen)

    out = attend(0, q, k_new, v_new, layout, DIM**-0.5)

    expected = reference(q[0], cache.keys[0], cache.values[0], 0, 9)
    torch.testing.assert_close(out[0], expected)


def test_score_bias_repeats_each_slots_mask_for_its_heads() -> None:
    visible = torch.tensor([[True, True, False], [True, False, False]])
    bias = score_bias(visible, 2, torch.float32)
    assert bias.shape == (4, 1, 3)
    inf = float("inf")
    expected = [[0.0, 0.0, -inf]] * 2 + [[0.0, -inf, -inf]] * 2
    assert bias[:, 0].tolist() == expected


def test_products_reach_the_longest_context_before_their_first_loss() -> None:
    shortest = PRODUCTS_PROBE_MIN_LEN
    # Probed contexts: shortest, 2x, 4x, 8x (the engine's longest).
    longest = 8 * shortest
    faster_then_slower = scripted_clock([0.5, 0.5, 2.0, 0.5])
    assert measure_products_max_len(SHAPE, torch.float32, longest, faster_then_slower) == (
        2 * shortest
    )
    assert measure_products_max_len(SHAPE, torch.float32, longest, scripted_clock([2.0])) is None
    everywhere = scripted_clock([0.5] * 4)
    assert measure_products_max_len(SHAPE, torch.float32, longest, everywhere) == longest
    # An engine whose longest context is below the shortest probe probes that context alone.
    assert measure_products_max_len(SHAPE, torch.float32, 40, scripted_clock([0.5])) == 40


def test_one_thread_decode_takes_keys_up_to_its_first_loss() -> None:
    # Probed contexts of one request: 64, 128, 256, 512 (the engine's longest).
    def most_keys(candidate_s: list[float], threads: int = 2) -> int:
        clock = scripted_clock(candidate_s, repeats=5)
        return measure_one_thread_decode_max_keys(
            SHAPE, torch.float32, 512, clock, num_threads=threads
        )

    assert most_keys([0.5, 0.5, 2.0, 0.5]) == 128
    assert most_keys([2.0]) == 0
    assert most_keys([0.5] * 4) == 512
    assert most_keys([], threads=1) == 0


def test_fresh_chunks_of_one_length_in_a_row_form_one_call() -> None:
    cpu = torch.device("cpu")
    spans = [
        PrefillSpan.of(3, 5, 0, 0, cpu), PrefillSpan.of(8, 5, 1, 0, cpu),  # a run of two
        PrefillSpan.of(13, 5, 2, 7, cpu),  # a continuation: its own call
        PrefillSpan.of(18, 5, 3, 0, cpu),  # alone: the next is longer
        PrefillSpan.of(23, 6, 4, 0, cpu), PrefillSpan.of(29, 6, 5, 0, cpu),
        PrefillSpan.of(35, 6, 6, 0, cpu),
    ]  # fmt: skip
    assert prefill_calls(tuple(spans)) == (
        FreshRun(3, 2, 5), spans[2], spans[3], FreshRun(23, 3, 6),
    )  # fmt: skip
    assert prefill_calls(()) == ()


def test_a_batched_call_gives_each_chunk_what_its_own_call_gives() -> None:
    """Bit for bit, in bfloat16: batching fresh chunks changes no rounding."""
    gen = torch.Generator().manual_seed(1)
    chunks, length, q_heads, kv_heads, dim = 5, 32, 9, 3, 64
    cache = SlotKVCache(KVShape(1, kv_heads, dim), torch.bfloat16, torch.device("cpu"), 8, 64)
    for request_id in range(chunks):
        cache.assign(request_id)
    cache.ensure(chunks, length)
    spans = tuple(
        PrefillSpan.of(i * length, length, i, 0, torch.device("cpu")) for i in range(chunks)
    )
    rows = chunks * length
    layout = StepLayout(
        cache=cache,
        decode_slots=torch.zeros(0, dtype=torch.long),
        decode_positions=torch.zeros(0, dtype=torch.long),
        decode_visible=torch.zeros(0, 0, dtype=torch.bool),
        decode_max_len=0,
        decode_is_dense=True,
        prefills=spans,
        write_rows=torch.arange(rows),
        write_slots=torch.arange(chunks).repeat_interleave(length),
        write_positions=torch.arange(length).repeat(chunks),
    )
    assert layout.prefill_calls == (FreshRun(0, chunks, length),)
    q, k_new, v_new = (
        torch.randn(rows, heads, dim, generator=gen).to(torch.bfloat16)
        for heads in (q_heads, kv_heads, kv_heads)
    )

    out = attend(0, q, k_new, v_new, layout, dim**-0.5)

    for i in range(chunks):
        part = slice(i * length, (i + 1) * length)
        own = torch.nn.functional.scaled_dot_product_attention(
            q[part].transpose(0, 1)[None],
            cache.keys[0, i, :, :length][None],
            cache.values[0, i, :, :length][None],
            is_causal=True, scale=dim**-0.5, enable_gqa=True,
        )[0].transpose(0, 1)  # fmt: skip
        assert torch.equal(out[part], own)


def test_cuda_attention_leaves_cudnn_out_unless_allowed() -> None:
    from torch.nn.attention import SDPBackend

    from tokenpace.engine.native.attention import attention_backends

    assert attention_backends("cpu", cudnn=False) is None
    assert attention_backends("cuda", cudnn=True) is None
    backends = attention_backends("cuda", cudnn=False)
    assert backends is not None and SDPBackend.CUDNN_ATTENTION not in backends
    assert SDPBackend.MATH in backends  # always some kernel that takes the call

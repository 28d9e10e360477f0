"""The attention function the native engine registers with transformers' AttentionInterface.

The unchanged model code runs one forward over a flattened batch (``[1, num_tokens]``): the
first ``num_decode`` tokens are single-token chunks ordered by KV slot, the rest are prefill
chunks laid end to end. Per layer, this function writes the new keys and values into the slot
cache in place (one indexed write per layer for the decode rows and the short prefill
chunks, a slice per long chunk: an indexed write moves 64-element runs one at a time, a slice
whole blocks), then attends:
decode tokens by grouped products over the packed slot rows (the query heads that share a KV
head are the rows of one small product against that head's keys, with no KV repeat), prefill
chunks one by one with SDPA under a causal mask offset by the chunk's start position (built
once per step, not per layer).

The padded decode call runs one of two ways, as the step's layout says: through the fused
SDPA kernel under a boolean mask, or as three batched operations (scores by one batched
product plus an additive bias built once per step, softmax, the weighted sum by a second
batched product: ``products_attention``). On a 2-core AVX2 CPU the batched products took
0.47-0.68x SDPA's time at 8-64 requests over 64-128 keys and came near parity by some 32,000
keys in all (64 requests over 512: 1.13x in one run, 0.97x in another);
``measure_products_max_len`` finds the crossover on the machine at hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tokenpace.engine.native.interleaved import beats
from tokenpace.engine.native.kv_cache import SlotKVCache
from tokenpace.engine.native.ragged_attention import RaggedDecode
from tokenpace.engine.native.small_ops import OneThread

ATTENTION_NAME = "tokenpace_slots"
# Prefill chunks up to this many tokens join the step's one indexed KV write; longer ones
# write by slice. On CPU an indexed write costs about 0.4 us per row, a slice about 10 us a
# call: one write of everything made a 512-token prefill 2-4% slower, and each 4-token
# chunk about 1 ms cheaper.
INDEXED_WRITE_MAX_TOKENS = 32
# Decode attention is padded to the longest context of its call; up to this many of the
# longest requests are attended on their own when that saves more than their calls cost
# (``engine.attention_plan.peeled``). One more SDPA call per layer cost about 12 us on the
# 2-core CPU here, what about 128 tokens of a padded row cost.
MAX_PEELED = 4
PEEL_CALL_TOKENS = 128
LAYOUT_KWARG = "tokenpace_layout"
# ``measure_products_max_len``: requests in a probed padded call, and its shortest context
# (each further probe doubles it, up to the engine's longest).
PRODUCTS_PROBE_BATCH = 32
PRODUCTS_PROBE_MIN_LEN = 64
# ``measure_one_thread_decode_max_keys``: the shortest probed context of one request.
ONE_THREAD_PROBE_MIN_LEN = 64


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    """A prefill chunk: flattened rows ``row .. row + num_tokens - 1`` hold positions
    ``start .. start + num_tokens - 1`` of the request in ``slot``. ``visible``
    (``[num_tokens, start + num_tokens]``, True where a key is visible) is the causal mask
    offset by ``start``; None for a chunk that starts the prompt (plain causal).
    ``write_by_slice``: the chunk writes its keys and values by a slice of its own; else
    the layout's indexed write covers them."""

    row: int
    num_tokens: int
    slot: int
    start: int
    visible: torch.Tensor | None = None
    write_by_slice: bool = False

    @classmethod
    def of(
        cls, row: int, num_tokens: int, slot: int, start: int, device: torch.device
    ) -> PrefillSpan:
        """The span, with its offset causal mask built on ``device`` when ``start`` > 0."""
        visible = None
        if start:
            positions = torch.arange(start, start + num_tokens, device=device)
            visible = torch.arange(start + num_tokens, device=device)[None, :] <= positions[:, None]
        return cls(row, num_tokens, slot, start, visible, num_tokens > INDEXED_WRITE_MAX_TOKENS)


@dataclass(frozen=True, slots=True)
class FreshRun:
    """``count`` (at least 2) consecutive prefill chunks of ``num_tokens`` tokens each, laid
    end to end from flattened row ``row``, each starting its prompt: no cached key precedes
    them, so they attend in one batched causal call over their own new keys and values
    (each chunk one batch entry, computed as its own call computes it)."""

    row: int
    count: int
    num_tokens: int

    @property
    def rows(self) -> slice:
        return slice(self.row, self.row + self.count * self.num_tokens)


def prefill_calls(spans: tuple[PrefillSpan, ...]) -> tuple[PrefillSpan | FreshRun, ...]:
    """The attention calls of a step's prefill ``spans`` (laid end to end, in row order):
    each run of two or more consecutive spans that start their prompts with the same length
    becomes one ``FreshRun``; every other span is a call of its own. One call per chunk
    cost about 170 us per layer on a 2-core CPU for 32-token chunks, a batched call about
    40 us per chunk."""
    calls: list[PrefillSpan | FreshRun] = []
    for (fresh, length), group in groupby(spans, key=lambda s: (s.start == 0, s.num_tokens)):
        members = list(group)
        if fresh and len(members) > 1:
            calls.append(FreshRun(members[0].row, len(members), length))
        else:
            calls.extend(members)
    return tuple(calls)


@dataclass(frozen=True, slots=True)
class StepLayout:
    """Where every flattened token of a step lives in the KV cache.

    ``decode_peeled``: (row, slot, length) of the decode rows attended on their own over
    their ``length`` keys; the padded call covers the others up to ``decode_max_len``.
    Decode rows ``0 .. len(decode_slots) - 1`` write position ``decode_positions[i]`` of
    slot ``decode_slots[i]`` (slots ascending); ``write_rows`` (the decode rows, then those
    of the prefill spans that do not write by slice) write positions ``write_positions`` of
    slots ``write_slots``; ``write_cache_rows`` (derived at construction, so the cache must
    not grow before the step runs) says where those rows land, per KV head, in a layer's
    cache seen as ``[slots * kv_heads * positions, head_dim]``, token-major.
    ``decode_visible`` is ``[num_span, max_len]``, True where a key is visible, for slots
    ``0 .. num_span - 1`` (rows of slots that do not decode this step keep one visible key
    so no row is fully masked);
    ``decode_is_dense`` says decode slots are exactly ``0 .. num_span - 1``. ``decode_bias``,
    when set, runs the padded decode call as batched products (``products_attention``) with
    this additive score bias, ``[num_span * kv_heads, 1, decode_max_len]`` (``score_bias``
    of ``decode_visible``); None runs it through the fused SDPA kernel, unmasked when
    ``decode_all_visible`` (every row of the call sees every key: on a 2-core AVX2 CPU one
    row attended 25-35% faster without the mask). ``decode_one_thread`` runs the decode
    attention on the calling thread (``small_ops.OneThread``): for small calls, where
    waking a sleeping thread costs more than the work it would take
    (``measure_one_thread_decode_max_keys``). ``decode_ragged``, when set, attends the
    decode rows by that kernel instead (``ragged_attention``), each over its own
    ``decode_lengths[i]`` keys of slot ``decode_slots[i]``: nothing padded, no mask, no
    peeling (``decode_visible`` then has no rows).
    """

    cache: SlotKVCache
    decode_slots: torch.Tensor
    decode_positions: torch.Tensor
    decode_visible: torch.Tensor
    decode_max_len: int
    decode_is_dense: bool
    prefills: tuple[PrefillSpan, ...]
    write_rows: torch.Tensor
    write_slots: torch.Tensor
    write_positions: torch.Tensor
    decode_peeled: tuple[tuple[int, int, int], ...] = ()
    decode_bias: torch.Tensor | None = None
    decode_all_visible: bool = False
    decode_one_thread: bool = False
    decode_ragged: RaggedDecode | None = None
    decode_lengths: torch.Tensor | None = None
    write_cache_rows: torch.Tensor = field(init=False)
    prefill_calls: tuple[PrefillSpan | FreshRun, ...] = field(init=False)

    def __post_init__(self) -> None:
        # The row of each written (token, KV head) in one layer's cache seen as
        # ``[slots * kv_heads * positions, head_dim]``: the step's KV write is then one
        # ``index_copy_`` per layer, which moves its rows on the calling thread. The
        # equivalent indexed assignment opened a parallel region, about 80 us a call on a
        # 2-core CPU whose idle threads sleep, against 5 us.
        heads = self.cache.shape.num_kv_heads
        positions = self.cache.capacity[1]
        head_ids = torch.arange(heads, device=self.write_slots.device)
        rows = (self.write_slots[:, None] * heads + head_ids) * positions
        rows = rows + self.write_positions[:, None]
        object.__setattr__(self, "write_cache_rows", rows.reshape(-1))
        object.__setattr__(self, "prefill_calls", prefill_calls(self.prefills))

    @property
    def num_decode(self) -> int:
        return int(self.decode_slots.shape[0])


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """AttentionInterface entry point. ``query`` is ``[1, q_heads, tokens, head_dim]``,
    ``key``/``value`` ``[1, kv_heads, tokens, head_dim]`` (RoPE applied); returns
    ``[1, tokens, q_heads, head_dim]``. Without a layout (e.g. inside ``generate``) it is
    plain SDPA attention."""
    layout: StepLayout | None = kwargs.get(LAYOUT_KWARG)
    if layout is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = attend(
        int(module.layer_idx),  # type: ignore[arg-type]
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        layout,
        scale,
    )
    return out.unsqueeze(0), None


def attend(
    layer: int,
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    layout: StepLayout,
    scale: float,
) -> torch.Tensor:
    """Write the step's keys and values of ``layer`` into the slot cache, then attend.
    ``q`` is ``[tokens, q_heads, dim]``, ``k_new``/``v_new`` ``[tokens, kv_heads, dim]``
    (RoPE applied), rows in the layout's order; returns ``[tokens, q_heads, dim]``."""
    keys = layout.cache.keys[layer]
    values = layout.cache.values[layer]
    if len(layout.write_rows):
        k_rows, v_rows = k_new, v_new
        if len(layout.write_rows) != len(k_new):
            k_rows, v_rows = k_new[layout.write_rows], v_new[layout.write_rows]
        dim = keys.shape[-1]
        cache_rows = layout.write_cache_rows
        keys.view(-1, dim).index_copy_(0, cache_rows, k_rows.reshape(-1, dim))
        values.view(-1, dim).index_copy_(0, cache_rows, v_rows.reshape(-1, dim))
    for span in layout.prefills:
        if span.write_by_slice:
            rows, end = slice(span.row, span.row + span.num_tokens), span.start + span.num_tokens
            keys[span.slot, :, span.start : end] = k_new[rows].transpose(0, 1)
            values[span.slot, :, span.start : end] = v_new[rows].transpose(0, 1)
    parts = []
    n = layout.num_decode
    if n:
        with OneThread() if layout.decode_one_thread else nullcontext():
            parts.append(_decode(q[:n], keys, values, layout, scale))
    # A batched call reads the new keys as computed; the cache holds them in its own dtype.
    calls = layout.prefill_calls if k_new.dtype == keys.dtype else layout.prefills
    for call in calls:
        if isinstance(call, FreshRun):
            parts.append(_fresh_run(q, k_new, v_new, call, scale))
            continue
        rows = slice(call.row, call.row + call.num_tokens)
        end = call.start + call.num_tokens
        parts.append(
            _prefill(q[rows], keys[call.slot, :, :end], values[call.slot, :, :end], call, scale)
        )
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _fresh_run(
    q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, run: FreshRun, scale: float
) -> torch.Tensor:
    """Causal attention of the chunks of ``run``, each over its own rows of ``k_new`` and
    ``v_new`` (all ``[tokens, heads, dim]``); returns the run's rows of the output."""
    q4, k4, v4 = (
        t[run.rows].view(run.count, run.num_tokens, *t.shape[1:]).transpose(1, 2)
        for t in (q, k_new, v_new)
    )
    out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).flatten(0, 1)


def _decode(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layout: StepLayout, scale: float
) -> torch.Tensor:
    """One query token per slot; ``q`` is ``[n, q_heads, dim]``. The query heads sharing a
    KV head form the rows of one small product against that head's ``[max_len, dim]`` keys
    (no KV repeat); the ``[span, kv_heads, max_len, dim]`` cache rows are a view, so the
    fused SDPA kernel reads KV in place."""
    n, num_q_heads, dim = q.shape
    num_kv_heads = keys.shape[1]
    if layout.decode_ragged is not None and layout.decode_lengths is not None:
        rows = q.reshape(n, num_kv_heads, num_q_heads // num_kv_heads, dim)
        out = layout.decode_ragged(
            rows, keys, values, layout.decode_slots, layout.decode_lengths, scale
        )
        return out.reshape(n, num_q_heads, dim)
    span = layout.decode_visible.shape[0]
    grouped = q.view(n, num_kv_heads, num_q_heads // num_kv_heads, dim)
    if not layout.decode_is_dense:
        full = grouped.new_zeros(span, *grouped.shape[1:])
        full[layout.decode_slots] = grouped
        grouped = full
    k = keys[:span, :, : layout.decode_max_len]
    v = values[:span, :, : layout.decode_max_len]
    if layout.decode_bias is not None:
        out = products_attention(grouped, k, v, layout.decode_bias, scale)
    else:
        mask = None if layout.decode_all_visible else layout.decode_visible[:, None, None, :]
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, scale=scale)
    if not layout.decode_is_dense:
        out = out[layout.decode_slots]
    for row, slot, length in layout.decode_peeled:
        one = q[row].reshape(1, num_kv_heads, num_q_heads // num_kv_heads, dim)
        out[row] = F.scaled_dot_product_attention(
            one, keys[slot : slot + 1, :, :length], values[slot : slot + 1, :, :length], scale=scale
        )[0]
    return out.reshape(n, num_q_heads, dim)


def score_bias(visible: torch.Tensor, num_kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive score bias of ``products_attention`` for a boolean ``visible``
    (``[num_span, length]``, True where a key is visible): 0 where visible, -inf elsewhere,
    each slot's row repeated for its ``num_kv_heads`` heads, ``[num_span * num_kv_heads, 1,
    length]``, in ``dtype`` on ``visible``'s device."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    bias.masked_fill_(~visible, float("-inf"))
    return bias.repeat_interleave(num_kv_heads, dim=0).unsqueeze(1)


def products_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """SDPA's result for ``q`` (``[n, kv_heads, group, dim]``: the query heads that share a
    KV head as rows) over ``keys``/``values`` (``[n, kv_heads, length, dim]``, views of the
    cache welcome) with the additive score ``bias`` (``[n * kv_heads, 1 or group, length]``,
    ``score_bias``), as a batched product for the scores, a softmax and a batched product
    for the weighted sum; the same values as SDPA to rounding."""
    n, kv_heads, group, dim = q.shape
    length = keys.shape[2]
    rows = n * kv_heads
    scores = torch.baddbmm(
        bias,
        q.reshape(rows, group, dim),
        keys.reshape(rows, length, dim).transpose(1, 2),
        alpha=scale,
    )
    weighted = torch.bmm(scores.softmax(dim=-1), values.reshape(rows, length, dim))
    return weighted.view(n, kv_heads, group, dim)


@dataclass(frozen=True, slots=True)
class DecodeShape:
    """What the decode-attention probes need of a model: KV heads, query heads per KV
    head, head size."""

    num_kv_heads: int
    group: int
    head_dim: int


def measure_products_max_len(
    shape: DecodeShape,
    dtype: torch.dtype,
    max_len: int,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 3,
) -> int | None:
    """The longest padded decode context up to which ``products_attention`` beats the fused
    SDPA kernel at every probed context (``PRODUCTS_PROBE_MIN_LEN``, doubling, up to
    ``max_len``), or None when SDPA wins at the first. Each probe attends
    ``PRODUCTS_PROBE_BATCH`` requests of random contexts between half the probed length and
    all of it, on CPU tensors of ``dtype``, timed by ``interleaved.beats`` (best of
    ``repeats``, SDPA first). The probing stops at the first loss."""
    batch = PRODUCTS_PROBE_BATCH
    num_kv_heads, group, head_dim = shape.num_kv_heads, shape.group, shape.head_dim
    generator = torch.Generator().manual_seed(0)
    q = torch.rand(batch, num_kv_heads, group, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5

    def products_win(length: int) -> bool:
        # The kernels' time does not depend on the keys' and values' values.
        shape = (batch, num_kv_heads, length, head_dim)
        keys = torch.full(shape, 0.5, dtype=dtype)
        values = torch.full(shape, 0.25, dtype=dtype)
        contexts = torch.randint(length // 2 + 1, length + 1, (batch,), generator=generator)
        contexts[0] = length
        visible = torch.arange(length)[None, :] < contexts[:, None]
        bias = score_bias(visible, num_kv_heads, dtype)
        mask = visible[:, None, None, :]
        products = partial(products_attention, q, keys, values, bias, scale)
        sdpa = partial(F.scaled_dot_product_attention, q, keys, values, attn_mask=mask, scale=scale)
        return beats(products, sdpa, clock, repeats)

    return _longest_winning(PRODUCTS_PROBE_MIN_LEN, max_len, products_win)


def _longest_winning(shortest: int, longest: int, wins: Callable[[int], bool]) -> int | None:
    """The longest of the probed lengths (``min(shortest, longest)``, doubling, up to
    ``longest``) up to which ``wins`` holds at every probe, or None when it fails at the
    first; probing (under inference mode) stops at the first failure."""
    winning = None
    length = min(shortest, longest)
    with torch.inference_mode():
        while length <= longest and wins(length):
            winning = length
            length *= 2
    return winning


def measure_one_thread_decode_max_keys(
    shape: DecodeShape,
    dtype: torch.dtype,
    max_len: int,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 5,
    num_threads: int | None = None,
) -> int:
    """The most keys up to which one request's decode attention (the fused SDPA kernel,
    unmasked, over ``[1, num_kv_heads, length, head_dim]`` CPU tensors of ``dtype``) runs
    faster on the calling thread than split over torch's threads, at every probed context
    (``ONE_THREAD_PROBE_MIN_LEN``, doubling, up to ``max_len``); 0 when the split wins at
    the first or torch runs one thread. Timed by ``interleaved.beats`` (best of
    ``repeats``, the split first); the probing stops at the first loss. Where idle threads
    sleep, the split pays a wake-up on every call. ``num_threads`` is torch's thread count
    unless given."""
    if (num_threads if num_threads is not None else torch.get_num_threads()) <= 1:
        return 0
    num_kv_heads, group, head_dim = shape.num_kv_heads, shape.group, shape.head_dim
    generator = torch.Generator().manual_seed(0)
    q = torch.rand(1, num_kv_heads, group, head_dim, generator=generator).to(dtype)
    scale = head_dim**-0.5
    one_thread = OneThread()

    def one_thread_wins(length: int) -> bool:
        shape = (1, num_kv_heads, length, head_dim)
        keys = torch.full(shape, 0.5, dtype=dtype)
        values = torch.full(shape, 0.25, dtype=dtype)
        split = partial(F.scaled_dot_product_attention, q, keys, values, scale=scale)

        def alone() -> torch.Tensor:
            with one_thread:
                return split()

        return beats(alone, split, clock, repeats)

    return _longest_winning(ONE_THREAD_PROBE_MIN_LEN, max_len, one_thread_wins) or 0


def _prefill(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: PrefillSpan, scale: float
) -> torch.Tensor:
    """Causal attention of ``q`` (``[tokens, q_heads, dim]``, the rows of ``span``) over
    ``keys``/``values`` (``[kv_heads, span.start + tokens, dim]``)."""
    q4 = q.transpose(0, 1).unsqueeze(0)
    k4, v4 = keys.unsqueeze(0), values.unsqueeze(0)
    if span.visible is None:
        out = F.scaled_dot_product_attention(
            q4, k4, v4, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        out = F.scaled_dot_product_attention(
            q4, k4, v4, attn_mask=span.visible, scale=scale, enable_gqa=True
        )
    return out[0].transpose(0, 1)


def attention_backends(device_type: str, cudnn: bool) -> list[SDPBackend] | None:
    """The SDPA backends a step's attention may use on a ``device_type`` device: None
    (torch's own order) on the CPU or with ``cudnn``; on CUDA otherwise flash, memory-
    efficient and math attention, without cuDNN's. torch sends SDPA to cuDNN first on
    recent GPUs, and cuDNN builds an execution plan for every new shape; a decode step's
    keys grow by one each step, so every step met a new shape: on an H200 decode steps
    whose shapes the process had met before took 5-11 ms, new ones 37-76 ms (a
    Llama-3.2-3B-shaped model, 1-128 requests)."""
    if device_type != "cuda" or cudnn:
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_context(backends: list[SDPBackend] | None) -> AbstractContextManager[None]:
    """The context a step's forward runs in: ``backends`` only, or unchanged for None."""
    return nullcontext() if backends is None else sdpa_kernel(backends)


def register() -> str:
    """Register ``slot_attention`` under ``ATTENTION_NAME`` (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, slot_attention)
    return ATTENTION_NAME

"""Decode attention on CPU by a compiled kernel that attends each request over its own
context: no padding to the step's longest, no mask, no score tensor.

torch's fused SDPA kernel treats a decode step as a padded batch: every request is
attended over the longest context of its call, under a mask, and each (request, KV head)
pair is a task of three query rows that pays the kernel's per-task set-up. The kernel here
(C++, built once per machine with ``torch.utils.cpp_extension`` and cached) runs one task
per (request, KV head) over the request's own keys, read in place from the slot cache:
scores in float32 from the cache's values, a softmax, the weighted sum, the result rounded
to the cache's dtype (round to nearest even), as SDPA's is. On a 2-core AVX-512 CPU, with
the keys and values out of cache as they are within a step, one call took 0.43-0.57x
SDPA's time at 8-64 requests over 64-512 keys. Whole bfloat16 decode steps of the SmolLM2
model, idle threads sleeping (the engine's default), ran 3-8% faster where every request
had the same context (batch 32 at 256 keys: 70 against 76 ms) and 12-24% faster at the
mixed contexts serving has, where SDPA pads to the longest (batch 16 at 50-600 keys: 55
against 64 ms; batch 32 at 30-400: 72 against 92 ms).

Supported: CPU tensors of bfloat16 or float32 (``SUPPORTED_DTYPES``). Building needs a C++
compiler; where it fails, ``build_ragged_decode`` says why and the engine keeps SDPA.
Whether the kernel wins is measured on the machine at hand (``ragged_wins``), never assumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from tokenpace.engine.native.compiled import (
    ELEMENT_ACCESS,
    CpuKernelSource,
    KernelBuild,
    build_cpu_kernel,
    module_name,
)
from tokenpace.engine.native.interleaved import beats

SUPPORTED_DTYPES = (torch.bfloat16, torch.float32)
# ``ragged_wins``: requests in the probe call, and the longest context (the others draw
# theirs between half of it and all of it, as a step's decodes differ).
PROBE_BATCH = 32
PROBE_MAX_LEN = 256

_SOURCE = (
    r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

"""
    + ELEMENT_ACCESS
    + r"""
// q [n, kv_heads, group, dim]; keys, values [slots, kv_heads, positions, dim] (contiguous);
// out like q. Request i attends positions 0 .. lengths[i] - 1 of slot slots[i].
template <typename T>
void attend(const T* q, const T* keys, const T* values, T* out, const int64_t* slots,
            const int64_t* lengths, int64_t n, int64_t kv_heads, int64_t group, int64_t dim,
            int64_t positions, float scale) {
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(group * dim), acc(group * dim), row(dim), scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, head = task % kv_heads, length = lengths[i];
      const int64_t base = (slots[i] * kv_heads + head) * positions * dim;
      const int64_t q_base = task * group * dim;
      for (int64_t x = 0; x < group * dim; ++x) query[x] = widen(q[q_base + x]) * scale;
      scores.resize(group * length);
      for (int64_t j = 0; j < length; ++j) {
        for (int64_t x = 0; x < dim; ++x) row[x] = widen(keys[base + j * dim + x]);
        for (int64_t r = 0; r < group; ++r) {
          const float* qr = query.data() + r * dim;
          float dot = 0.f;
          for (int64_t x = 0; x < dim; ++x) dot += qr[x] * row[x];
          scores[r * length + j] = dot;
        }
      }
      for (int64_t r = 0; r < group; ++r) {
        float* s = scores.data() + r * length;
        float top = s[0];
        for (int64_t j = 1; j < length; ++j) top = s[j] > top ? s[j] : top;
        float sum = 0.f;
        for (int64_t j = 0; j < length; ++j) {
          s[j] = std::exp(s[j] - top);
          sum += s[j];
        }
        const float inverse = 1.f / sum;
        for (int64_t j = 0; j < length; ++j) s[j] *= inverse;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < length; ++j) {
        for (int64_t x = 0; x < dim; ++x) row[x] = widen(values[base + j * dim + x]);
        for (int64_t r = 0; r < group; ++r) {
          const float weight = scores[r * length + j];
          float* a = acc.data() + r * dim;
          for (int64_t x = 0; x < dim; ++x) a[x] += weight * row[x];
        }
      }
      for (int64_t x = 0; x < group * dim; ++x) put(out, q_base + x, acc[x]);
    }
  });
}

}  // namespace

torch::Tensor ragged_decode(torch::Tensor q, torch::Tensor keys, torch::Tensor values,
                            torch::Tensor slots, torch::Tensor lengths, double scale) {
  TORCH_CHECK(q.dim() == 4 && keys.dim() == 4 && values.sizes() == keys.sizes(),
              "q must be [n, kv_heads, group, dim], keys and values [slots, kv_heads, "
              "positions, dim]");
  TORCH_CHECK(q.size(1) == keys.size(1) && q.size(3) == keys.size(3),
              "q and keys disagree on kv_heads or dim");
  TORCH_CHECK(q.scalar_type() == keys.scalar_type() && keys.scalar_type() == values.scalar_type(),
              "q, keys and values must share a dtype");
  TORCH_CHECK(slots.numel() == q.size(0) && lengths.numel() == q.size(0),
              "one slot and one length per request");
  auto query = q.contiguous();
  auto k = keys.contiguous();
  auto v = values.contiguous();
  auto slot = slots.to(torch::kLong).contiguous();
  auto length = lengths.to(torch::kLong).contiguous();
  const int64_t* lp = length.data_ptr<int64_t>();
  const int64_t* sp = slot.data_ptr<int64_t>();
  for (int64_t i = 0; i < q.size(0); ++i) {
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= keys.size(2), "a length is outside 1 .. positions");
    TORCH_CHECK(sp[i] >= 0 && sp[i] < keys.size(0), "a slot is outside the cache");
  }
  auto out = torch::empty_like(query);
  const int64_t n = q.size(0), heads = q.size(1), group = q.size(2), dim = q.size(3);
  const int64_t positions = keys.size(2);
  const float s = static_cast<float>(scale);
  if (query.scalar_type() == torch::kBFloat16) {
    auto as_bits = [](const torch::Tensor& t) {
      return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
    };
    attend(as_bits(query), as_bits(k), as_bits(v), as_bits(out), sp, lp, n, heads, group, dim,
           positions, s);
  } else {
    TORCH_CHECK(query.scalar_type() == torch::kFloat, "bfloat16 or float32 only");
    attend(query.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(),
           out.data_ptr<float>(), sp, lp, n, heads, group, dim, positions, s);
  }
  return out;
}
"""
)


_KERNEL = CpuKernelSource(
    _SOURCE,
    ("ragged_decode",),
    ("-O3", "-march=native", "-ffast-math"),
    SUPPORTED_DTYPES,
    "the ragged decode kernel",
)


class RaggedDecode(Protocol):
    """``(q, keys, values, slots, lengths, scale) -> out``: ``q`` is ``[n, kv_heads,
    group, dim]`` (the query heads that share a KV head as rows), ``keys``/``values`` a
    layer's slot cache ``[slots, kv_heads, positions, dim]``; request ``i`` attends
    positions ``0 .. lengths[i] - 1`` of slot ``slots[i]``; ``out`` is shaped as ``q``,
    in its dtype."""

    def __call__(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        slots: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
    ) -> torch.Tensor: ...


# The built kernel, or None with the reason why there is none.
RaggedBuild = KernelBuild[RaggedDecode]


def _module_name() -> str:
    """The build's name (``compiled.module_name``: unique to the source, this CPU and
    torch)."""
    return module_name("tokenpace_ragged_decode", _SOURCE)


def build_ragged_decode(build_dir: Path, device: torch.device, dtype: torch.dtype) -> RaggedBuild:
    """Build (once: later calls load the cached build from ``build_dir``) the ragged decode
    kernel for ``device`` and ``dtype``; a ``RaggedBuild`` without a kernel, with the
    reason, on a device other than the CPU, for an unsupported dtype, or where building
    fails (no C++ compiler, say)."""
    built = build_cpu_kernel(_KERNEL, _module_name(), build_dir, device, dtype)
    if built.module is None:
        return RaggedBuild(None, built.reason)
    kernel: RaggedDecode = built.module.ragged_decode
    return RaggedBuild(kernel)


def ragged_wins(
    kernel: RaggedDecode,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    max_len: int,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 3,
) -> bool:
    """Whether ``kernel`` beats the fused SDPA kernel on a padded, masked call (what a step
    runs otherwise) for ``PROBE_BATCH`` requests whose contexts lie between half of
    ``min(PROBE_MAX_LEN, max_len)`` and all of it, on CPU tensors of ``dtype``, timed by
    ``interleaved.beats`` (best of ``repeats``)."""
    length = min(PROBE_MAX_LEN, max_len)
    generator = torch.Generator().manual_seed(0)
    q = torch.rand(PROBE_BATCH, num_kv_heads, group, head_dim, generator=generator).to(dtype)
    shape = (PROBE_BATCH, num_kv_heads, length, head_dim)
    keys = torch.rand(shape, generator=generator).to(dtype)
    values = torch.rand(shape, generator=generator).to(dtype)
    lengths = torch.randint(length // 2 + 1, length + 1, (PROBE_BATCH,), generator=generator)
    lengths[0] = length
    slots = torch.arange(PROBE_BATCH)
    mask = (torch.arange(length)[None, :] < lengths[:, None])[:, None, None, :]
    scale = head_dim**-0.5
    ragged = partial(kernel, q, keys, values, slots, lengths, scale)
    sdpa = partial(F.scaled_dot_product_attention, q, keys, values, attn_mask=mask, scale=scale)
    with torch.inference_mode():
        return beats(ragged, sdpa, clock, repeats)

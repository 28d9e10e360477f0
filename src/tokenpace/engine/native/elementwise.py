"""The elementwise work between a layer's products, by torch's operations or by a compiled
kernel that does each piece in one pass.

Between its four products a Llama layer runs an RMS norm, rotary embeddings, a residual add
and a second norm, and the gated activation: about twenty torch operations a layer, each a
dispatch and a pass over memory, and for bfloat16 a conversion to float32 and back. At the
few rows of a decode step their fixed costs are most of their time.
``TorchElementwise`` runs them as transformers' Llama code does. ``CompiledElementwise``
runs each piece as one call of a small C++ kernel (built once per machine with torch's
extension builder and cached, as ``compiled`` says) that reads its inputs once, computes in
float32 and rounds to the tensors' dtype wherever torch's operations round (round to
nearest even), in the same order: on bfloat16 its values are torch's, bit for bit, but for
rare last-bit differences of the norm's sum of squares (another summation order) and of
SiLU's exponential (its own polynomial); on float32 they agree to rounding. On a 2-core
AVX-512 CPU, one thread, 32 rows of the SmolLM2 model's widths: a norm 6 against 30 us, a
residual add and norm 9 against 35, the rotary embeddings 12-16 against 29, the gated
activation 32 against 39.

Supported: CPU tensors of bfloat16 or float32 (``SUPPORTED_DTYPES``). Building needs a C++
compiler; where it fails, ``build_elementwise`` says why and the engine keeps torch's
operations. Whether the kernel wins is measured on the machine at hand
(``compiled_elementwise_wins``), never assumed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
# ``compiled_elementwise_wins``: the rows (tokens) of the probed layer's work.
PROBE_TOKENS = 32

_SOURCE = (
    r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <vector>

namespace {

"""
    + ELEMENT_ACCESS
    + r"""
// Rows per task of at::parallel_for for rows of `width` elements: work of up to torch's
// grain (at::internal::GRAIN_SIZE elements) stays on the calling thread, as torch's own
// elementwise operations do, so that no sleeping thread is woken for it.
inline int64_t grain_rows(int64_t width) {
  return std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(1, width));
}

// exp(x) for x in float32, branch-free so that loops over it vectorize: x = n ln2 + r,
// |r| <= ln2 / 2, exp(r) by a degree-6 polynomial, 2^n by the exponent bits.
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // round to nearest by the 1.5 * 2^23 trick (vectorizes where nearbyint may not)
  const float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

// out[row] = weight * round(x[row] / rms(x[row])); also x[row] += delta[row] first when
// delta is given (x updated in place, rounded to its type).
template <typename T>
void norm_rows(T* x, const T* delta, const T* weight, T* out, int64_t rows, int64_t width,
               float eps) {
  at::parallel_for(0, rows, grain_rows(width), [&](int64_t begin, int64_t end) {
    std::vector<float> row(width);
    float* v = row.data();
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * width;
      if (delta != nullptr) {
        const T* dr = delta + r * width;
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) {
          const float sum = narrow_value(widen(xr[j]) + widen(dr[j]), xr);
          v[j] = sum;
          put(xr, j, sum);
        }
      } else {
#pragma omp simd
        for (int64_t j = 0; j < width; ++j) v[j] = widen(xr[j]);
      }
      float total = 0.f;
#pragma omp simd reduction(+ : total)
      for (int64_t j = 0; j < width; ++j) total += v[j] * v[j];
      const float inverse = 1.f / std::sqrt(total / static_cast<float>(width) + eps);
      T* o = out + r * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) {
        put(o, j, widen(weight[j]) * narrow_value(v[j] * inverse, xr));
      }
    }
  });
}

// qkv [tokens, heads, dim]: the first `rotated` heads become v * cos + turn(v) * sin,
// turn(v) = cat(v[half:], v[:half]) (sin carries rotate_half's sign), in place.
template <typename T>
void rope_rows(T* qkv, const T* cos, const T* sin, int64_t tokens, int64_t heads, int64_t rotated,
               int64_t dim) {
  const int64_t half = dim / 2;
  at::parallel_for(0, tokens, grain_rows(rotated * dim), [&](int64_t begin, int64_t end) {
    std::vector<float> v(dim);
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + t * dim;
      const T* s = sin + t * dim;
      for (int64_t h = 0; h < rotated; ++h) {
        T* p = qkv + (t * heads + h) * dim;
        float* w = v.data();
#pragma omp simd
        for (int64_t j = 0; j < dim; ++j) w[j] = widen(p[j]);
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const float a = narrow_value(w[j] * widen(c[j]), p);
          put(p, j, a + narrow_value(w[j + half] * widen(s[j]), p));
        }
#pragma omp simd
        for (int64_t j = half; j < dim; ++j) {
          const float a = narrow_value(w[j] * widen(c[j]), p);
          put(p, j, a + narrow_value(w[j - half] * widen(s[j]), p));
        }
      }
    }
  });
}

// out [tokens, inner] = round(silu(gate)) * up, gate_up [tokens, 2 * inner].
template <typename T>
void silu_mul_rows(const T* gate_up, T* out, int64_t tokens, int64_t inner) {
  at::parallel_for(0, tokens, grain_rows(2 * inner), [&](int64_t begin, int64_t end) {
    const int64_t width = inner;
    std::vector<float> buffer(width);
    float* act = buffer.data();
    for (int64_t t = begin; t < end; ++t) {
      const T* g = gate_up + t * 2 * width;
      const T* u = g + width;
      T* o = out + t * width;
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) {
        const float x = widen(g[j]);
        act[j] = x / (1.f + fast_exp(-x));
      }
#pragma omp simd
      for (int64_t j = 0; j < width; ++j) put(o, j, narrow_value(act[j], o) * widen(u[j]));
    }
  });
}

// Calls f with a null pointer of the element type of t (bfloat16 as its bits), after
// checking that every one of `others` is a CPU tensor of that type.
template <typename F>
void dispatch(const torch::Tensor& t, std::initializer_list<torch::Tensor> others, F&& f) {
  TORCH_CHECK(t.device().is_cpu(), "CPU tensors only");
  for (const auto& other : others) {
    TORCH_CHECK(other.device().is_cpu() && other.scalar_type() == t.scalar_type(),
                "every tensor must be a CPU tensor of the first one's dtype");
  }
  if (t.scalar_type() == torch::kBFloat16) {
    f(static_cast<uint16_t*>(nullptr));
  } else {
    TORCH_CHECK(t.scalar_type() == torch::kFloat, "bfloat16 or float32 only");
    f(static_cast<float*>(nullptr));
  }
}
template <typename T>
T* ptr(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && weight.numel() == x.size(1),
              "x must be [rows, width], weight [width]");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  auto w = weight.contiguous();
  dispatch(xc, {w}, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    norm_rows<T>(ptr<T>(xc), nullptr, ptr<T>(w), ptr<T>(out), xc.size(0), xc.size(1),
                 static_cast<float>(eps));
  });
  return out;
}

std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor delta,
                                        torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && weight.numel() == x.size(1),
              "x must be [rows, width], weight [width]");
  TORCH_CHECK(delta.sizes() == x.sizes(), "delta must be shaped as x");
  auto d = delta.contiguous();
  auto sum = x.clone(at::MemoryFormat::Contiguous);
  auto out = torch::empty_like(x);
  auto w = weight.contiguous();
  dispatch(x, {d, w}, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    norm_rows<T>(ptr<T>(sum), ptr<T>(d), ptr<T>(w), ptr<T>(out), x.size(0), x.size(1),
                 static_cast<float>(eps));
  });
  return {sum, out};
}

void rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t rotated) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous(), "qkv must be contiguous [tokens, heads, dim]");
  const int64_t tokens = qkv.size(0), heads = qkv.size(1), dim = qkv.size(2);
  TORCH_CHECK(rotated >= 0 && rotated <= heads && dim % 2 == 0, "bad rotated heads or dim");
  auto c = cos.contiguous();
  auto s = sin.contiguous();
  TORCH_CHECK(c.numel() == tokens * dim && s.numel() == tokens * dim, "cos, sin: [tokens, dim]");
  dispatch(qkv, {c, s}, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rope_rows<T>(ptr<T>(qkv), ptr<T>(c), ptr<T>(s), tokens, heads, rotated, dim);
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "gate_up must be [tokens, 2 * inner]");
  auto g = gate_up.contiguous();
  const int64_t tokens = g.size(0), inner = g.size(1) / 2;
  auto out = torch::empty({tokens, inner}, g.options());
  dispatch(g, {}, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_mul_rows<T>(ptr<T>(g), ptr<T>(out), tokens, inner);
  });
  return out;
}
"""
)
# Compiled without fast-math and without contracting products and sums into fused
# multiply-adds, so that it rounds where torch's operations do.
_KERNEL = CpuKernelSource(
    _SOURCE,
    ("rms_norm", "add_rms_norm", "rope_", "silu_mul"),
    ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off"),
    SUPPORTED_DTYPES,
    "the elementwise kernel",
)


class Elementwise(Protocol):
    """The elementwise pieces of a Llama layer, on ``[tokens, width]`` rows."""

    name: str

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of ``x``'s rows: float32 statistics, ``weight`` applied in the input
        dtype."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + delta, rms_norm(x + delta))``; ``x`` is left as it is."""
        ...

    def rope(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated: int
    ) -> torch.Tensor:
        """The first ``rotated`` heads of ``qkv`` (``[tokens, heads, dim]``) rotated by
        RoPE: ``v * cos + cat(v[half:], v[:half]) * sin``, ``cos`` and ``sin``
        ``[tokens, 1, dim]`` with rotate_half's sign folded into ``sin``; returns
        ``[tokens, rotated, dim]``. ``qkv`` may be overwritten."""
        ...

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of ``gate_up`` = ``cat(gate, up)`` on its last dimension."""
        ...


class TorchElementwise:
    """The pieces by torch's operations, as transformers' Llama code runs them."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + delta
        return total, self.rms_norm(total, weight, eps)

    def rope(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated: int
    ) -> torch.Tensor:
        half = qkv.shape[-1] // 2
        heads = qkv[:, :rotated]
        turned = torch.cat((heads[..., half:], heads[..., :half]), dim=-1)
        return heads * cos + turned * sin

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class CompiledElementwise:
    """The pieces by the compiled kernel (``build_elementwise``), each in one call."""

    name = "compiled"

    def __init__(self, module: Any) -> None:
        self._module = module

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out: torch.Tensor = self._module.rms_norm(x, weight, eps)
        return out

    def add_rms_norm(
        self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total, normed = self._module.add_rms_norm(x, delta, weight, eps)
        return total, normed

    def rope(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated: int
    ) -> torch.Tensor:
        self._module.rope_(qkv, cos, sin, rotated)
        return qkv[:, :rotated]

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self._module.silu_mul(gate_up)
        return out


# The built kernel, or None with the reason why there is none.
ElementwiseBuild = KernelBuild[CompiledElementwise]


def _module_name() -> str:
    """The build's name (``compiled.module_name``: unique to the source, this CPU and
    torch)."""
    return module_name("tokenpace_elementwise", _SOURCE)


def build_elementwise(
    build_dir: Path, device: torch.device, dtype: torch.dtype
) -> ElementwiseBuild:
    """Build (once: later calls load the cached build from ``build_dir``) the compiled
    elementwise kernel for ``device`` and ``dtype``; an ``ElementwiseBuild`` without a
    kernel, with the reason, on a device other than the CPU, for an unsupported dtype, or
    where building fails (no C++ compiler, say)."""
    built = build_cpu_kernel(_KERNEL, _module_name(), build_dir, device, dtype)
    if built.module is None:
        return ElementwiseBuild(None, built.reason)
    return ElementwiseBuild(CompiledElementwise(built.module))


@dataclass(frozen=True, slots=True)
class LayerWidths:
    """The widths a layer's elementwise work runs at: ``hidden`` (the residual stream),
    ``heads`` and ``kv_heads`` of ``head_dim`` (the query/key/value product's output) and
    ``intermediate`` (the MLP's, per half of its gate/up product)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


def layer_work(
    elementwise: Elementwise, widths: LayerWidths, dtype: torch.dtype, tokens: int = PROBE_TOKENS
) -> Callable[[], object]:
    """One layer's elementwise work at ``tokens`` rows by ``elementwise`` (norm, RoPE,
    residual add and norm, gated activation, residual add), on random inputs of ``dtype``."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    x, delta, weight = rand(tokens, widths.hidden), rand(tokens, widths.hidden), rand(widths.hidden)
    heads = widths.heads + 2 * widths.kv_heads
    qkv = rand(tokens, heads, widths.head_dim)
    cos, sin = rand(tokens, 1, widths.head_dim), rand(tokens, 1, widths.head_dim)
    gate_up = rand(tokens, 2 * widths.intermediate)
    rotated = widths.heads + widths.kv_heads

    def run() -> object:
        normed = elementwise.rms_norm(x, weight, 1e-5)
        rotated_heads = elementwise.rope(qkv, cos, sin, rotated)
        total, normed = elementwise.add_rms_norm(x, delta, weight, 1e-5)
        return normed, rotated_heads, elementwise.silu_mul(gate_up), total + delta

    return run


def compiled_elementwise_wins(
    kernel: CompiledElementwise,
    widths: LayerWidths,
    dtype: torch.dtype,
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 5,
) -> bool:
    """Whether ``kernel`` runs a layer's elementwise work (``layer_work``, at
    ``PROBE_TOKENS`` rows) faster than torch's operations, timed by ``interleaved.beats``
    (best of ``repeats``)."""
    compiled = layer_work(kernel, widths, dtype)
    plain = layer_work(TorchElementwise(), widths, dtype)
    with torch.inference_mode():
        return beats(compiled, plain, clock, repeats)

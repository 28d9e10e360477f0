"""Products of a few activation rows with bfloat16 weights, read in bfloat16.

At one to a few rows a decode step's projections do little but read their weights, so the
step is bound by the weights' bytes. On a CPU without bfloat16 instructions torch's
bfloat16 product costs time in proportion to its rows, and the float32 products of
``linear_kernels`` read float32 copies, twice the bytes. This kernel reads each weight row
as 16-bit patterns, widens it exactly to float32 (a bfloat16 is the upper half of a
float32) and sums each output in float32. The result is the float32 product up to the
summation order (reassociated into vector lanes, with fused multiply-adds), as the float32
products of ``linear_kernels`` are; the caller rounds it to bfloat16 as those do.

The product runs on the calling thread: where idle threads sleep, waking one costs more
than a small weight's read (see ``small_ops``), and numba's threading layers do not mix
well with torch's (its OpenMP layer, a second OpenMP runtime in the process, made torch's
two-thread steps 3x slower on a 2-core CPU; its own work queue aborts the process on
concurrent calls). Callers keep large weights on their other product.

The loop is compiled when the module is imported and cached beside it (``scripts/setup.sh``
compiles it once). Importing the module raises ImportError where numba is missing.

The same product also comes as a small C++ kernel (``CompiledRows``, built once per machine
as ``compiled`` says). It reads four weight rows at a time (from the L1 cache for every row
of ``x`` after the first) and sums in sixteen float32 lanes. Over the SmolLM2 model's layer
weights at one row (212 MB, read from memory as in a step), on one thread of the 2-core
AVX-512 CPU here, it took 9.2-10.2 ms against numba's 12.6-14.5 ms (21-23 against 15-17
GB/s). Both are a ``RowsProduct``; the engine takes the compiled one where it builds and a
probe finds it faster (``compiled_rows_win``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numba
import numpy as np
import numpy.typing as npt
import torch

from tokenpace.engine.native.compiled import (
    ELEMENT_ACCESS,
    CpuKernelSource,
    KernelBuild,
    build_cpu_kernel,
    module_name,
)
from tokenpace.engine.native.interleaved import beats

Bits = npt.NDArray[np.uint16]
_SIGNATURE = "void(float32[:, ::1], uint16[:, ::1], float32[:, ::1])"


@numba.njit(  # type: ignore[untyped-decorator]
    _SIGNATURE, cache=True, nogil=True, fastmath={"reassoc", "contract"}
)
def _rows_product(x, weight_bits, out):  # type: ignore[no-untyped-def]  # pragma: no cover
    num_out, num_in = weight_bits.shape
    widened = np.empty(num_in, np.uint32)
    values = widened.view(np.float32)
    for column in range(num_out):
        for i in range(num_in):
            widened[i] = np.uint32(weight_bits[column, i]) << 16
        for row in range(x.shape[0]):
            total = np.float32(0.0)
            for i in range(num_in):
                total += x[row, i] * values[i]
            out[row, column] = total


def weight_bits(weight: torch.Tensor) -> Bits:
    """The 16-bit patterns of a contiguous 2-d bfloat16 CPU ``weight`` (``[out, in]``),
    sharing its memory; ValueError for any other weight."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(
            f"bf16_rows reads 2-d bfloat16 CPU weights, got {weight.dtype} "
            f"{tuple(weight.shape)} on {weight.device}"
        )
    if not weight.is_contiguous():
        raise ValueError("bf16_rows reads contiguous weights")
    bits: Bits = weight.detach().view(torch.int16).numpy().view(np.uint16)
    return bits


def bf16_rows_product(x: torch.Tensor, bits: Bits) -> torch.Tensor:
    """``x @ weight.T`` in float32 on the calling thread (see the module doc), ``bits``
    being ``weight_bits(weight)`` and ``x`` ``[rows, in]`` on the CPU; the result
    ``[rows, out]`` in ``x``'s dtype."""
    x32 = np.ascontiguousarray(x.detach().to(torch.float32).numpy())
    out = np.empty((x32.shape[0], bits.shape[0]), dtype=np.float32)
    _rows_product(x32, bits, out)
    return torch.from_numpy(out).to(x.dtype)


class RowsProduct(Protocol):
    """``x @ weight.T`` in float32 for a few rows of ``x``, read from the bfloat16
    ``weight`` (``[out, in]``, contiguous, on the CPU) or its 16-bit patterns ``bits``
    (``weight_bits(weight)``), on the calling thread; the result in ``x``'s dtype.
    ``name`` says which implementation it is (for reports)."""

    @property
    def name(self) -> str: ...

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bits: Bits, /) -> torch.Tensor: ...


class NumbaRows:
    """The product by the numba loop above (``bf16_rows_product``)."""

    name = "numba"

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bits: Bits) -> torch.Tensor:
        return bf16_rows_product(x, bits)


NUMBA_ROWS = NumbaRows()

_SOURCE = (
    r"""
#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

"""
    + ELEMENT_ACCESS
    + r"""
// out[r, o] = sum_i x[r, i] * w[o, i]: four weight rows at a time (kept in the L1 cache
// while every row of x takes its product with them), each sum in sixteen float32 lanes
// (reassociated), the weights' bfloat16 patterns widened exactly.
void rows_product_f32(const float* x, const uint16_t* w, float* out, int64_t rows,
                      int64_t n_out, int64_t n_in) {
  for (int64_t o = 0; o < n_out; o += 4) {
    const int64_t block = std::min<int64_t>(4, n_out - o);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n_in;
      for (int64_t b = 0; b < block; ++b) {
        const uint16_t* wr = w + (o + b) * n_in;
        float lanes[16] = {0.f};
        int64_t i = 0;
        for (; i + 16 <= n_in; i += 16) {
#pragma GCC unroll 16
          for (int l = 0; l < 16; ++l) lanes[l] += xr[i + l] * widen(wr[i + l]);
        }
        float total = 0.f;
        for (; i < n_in; ++i) total += xr[i] * widen(wr[i]);
        for (int l = 0; l < 16; ++l) total += lanes[l];
        out[r * n_out + o + b] = total;
      }
    }
  }
}

}  // namespace

torch::Tensor rows_product(torch::Tensor x, torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.device().is_cpu() &&
                  weight.scalar_type() == torch::kBFloat16,
              "weight must be a contiguous 2-d bfloat16 CPU tensor");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == weight.size(1) && x.device().is_cpu(),
              "x must be a CPU tensor [rows, in] of the weight's in");
  auto x32 = x.to(torch::kFloat).contiguous();
  auto out = torch::empty({x.size(0), weight.size(0)}, x32.options());
  rows_product_f32(x32.data_ptr<float>(), reinterpret_cast<const uint16_t*>(weight.data_ptr()),
                   out.data_ptr<float>(), x.size(0), weight.size(0), weight.size(1));
  return out.to(x.scalar_type());
}
"""
)
_KERNEL = CpuKernelSource(
    _SOURCE,
    ("rows_product",),
    ("-O3", "-march=native", "-ffast-math"),
    (torch.bfloat16,),
    "the compiled few-rows product",
)


class CompiledRows:
    """The product by the compiled kernel (``build_compiled_rows``)."""

    name = "compiled"

    def __init__(self, module: Any) -> None:
        self._module = module

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bits: Bits) -> torch.Tensor:
        out: torch.Tensor = self._module.rows_product(x, weight)
        return out


def _module_name() -> str:
    """The build's name (``compiled.module_name``: unique to the source, this CPU and
    torch)."""
    return module_name("tokenpace_rows_product", _SOURCE)


def build_compiled_rows(
    build_dir: Path, device: torch.device, dtype: torch.dtype
) -> KernelBuild[CompiledRows]:
    """Build (once: later calls load the cached build from ``build_dir``) the compiled
    few-rows product for bfloat16 weights on the CPU; a build without a kernel, with the
    reason, on another device, for another dtype, or where building fails."""
    built = build_cpu_kernel(_KERNEL, _module_name(), build_dir, device, dtype)
    if built.module is None:
        return KernelBuild(None, built.reason)
    return KernelBuild(CompiledRows(built.module))


def rows_pass(
    rows: RowsProduct,
    xs: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    bits: Sequence[Bits],
) -> None:
    """One product by ``rows`` of each of ``xs`` with its weight."""
    for x, weight, patterns in zip(xs, weights, bits, strict=True):
        rows(x, weight, patterns)


def compiled_rows_win(
    compiled: RowsProduct,
    weights: Sequence[torch.Tensor],
    clock: Callable[[], float] = time.perf_counter,
    repeats: int = 3,
) -> bool:
    """Whether ``compiled`` computes a one-row product with each of ``weights`` (bfloat16,
    on the CPU) faster than the numba loop, over a pass of them, each side its best of
    ``repeats`` interleaved passes (``interleaved.beats``)."""
    bits = [weight_bits(weight) for weight in weights]
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights]
    with torch.inference_mode():
        return beats(
            partial(rows_pass, compiled, xs, weights, bits),
            partial(rows_pass, NUMBA_ROWS, xs, weights, bits),
            clock,
            repeats,
        )

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
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import torch

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

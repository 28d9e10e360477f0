"""Matrix products of reduced-precision weights on CPUs that lack a fast kernel for them.

On a CPU without bfloat16/float16 matrix instructions, torch's reduced-precision product
costs time in proportion to its rows: fine for a one-token decode step (it reads the weight
once), many times slower than float32 for a batch or a prefill chunk. ``UpcastLinear``
computes such products in float32 instead (exact upcasts, float32 accumulation, the result
rounded back to the activations' dtype). It takes the float32 weight one of two ways:

- packed (``UpcastLinear(rows, packed=True)``): a float32 copy of each weight, made once at
  load and reordered into the blocked layout oneDNN's kernels read (``torch.ops.mkldnn``),
  at the cost of twice the reduced-precision weights' memory (``float32_copies_fit``). On
  a 2-core AVX2 CPU this computed the model's projections at 8-64 rows 2-4x faster than
  converting blocks per step and 1.4-2.3x faster than torch's float32 product on the same
  values.
- converted per step: the weight converted block by block, each block small enough to stay
  in cache (so the weight is still read once per step); no memory is added.

Whether, and from how many rows on, the float32 product wins is measured on the machine at
hand (``measure_upcast_min_rows``), never assumed.

On a CPU with such instructions, and for float32 weights on any CPU, torch's default
product takes the weight in its plain row-major layout on every call. ``PackedLinear``
instead reorders each weight once, at load, into oneDNN's blocked layout, and computes the
same product from it, at the cost of a second copy of the projection weights: bit-for-bit
the same result in bfloat16 and float16; in float32 the same values summed in oneDNN's
order (equal to rounding). On a 2-core AVX2 CPU, float32 projections ran 1.4x faster packed
at one row and 1.8x at 16. Whether it wins is measured (``measure_packing_wins``).

A kernel (``LinearKernel``) prepares each weight once (``prepare``, giving a
``PreparedWeight``) and is then called with the activations and the prepared weight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from tokenpace.core.procfs import proc_field
from tokenpace.engine.native.bf16_rows import NUMBA_ROWS, RowsProduct, rows_pass, weight_bits
from tokenpace.engine.native.interleaved import beats, best_times
from tokenpace.engine.native.small_ops import NO_SMALL_OPS, SmallOps

Clock = Callable[[], float]
# float32 bytes per converted block: small enough to stay in a core's L2 cache.
_BLOCK_BYTES = 1 << 19
_MIN_BLOCK_ROWS = 64
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)
PACKING_PROBE_ROWS = (1, 16, 64)
# Up to a few rows a product is bound by reading its weight; at 8 rows one thread's
# arithmetic already cost more than the second thread's wake-up (the split size is measured
# at one row), and bf16_rows lost 0.9x on a 2-core AVX2 CPU where its probe had let it in.
FEW_ROWS_PROBE_ROWS = (1, 2, 4)


@dataclass(frozen=True, slots=True)
class PreparedWeight:
    """A weight as a kernel reads it: ``plain`` is the weight itself (row-major, what
    torch's product takes; the model's own tensor, so it adds no memory), ``packed`` the
    copy the kernel made of it at load, if any, and ``bits`` the bfloat16 weight's 16-bit
    patterns (``bf16_rows.weight_bits``, sharing its memory) for a kernel that reads them."""

    plain: torch.Tensor
    packed: torch.Tensor | None = None
    bits: npt.NDArray[np.uint16] | None = None

    def packed_or_raise(self) -> torch.Tensor:
        """``packed``; ValueError when the weight was not packed."""
        if self.packed is None:
            raise ValueError("this weight was prepared without a packed copy")
        return self.packed


class LinearKernel(Protocol):
    """How the fused forward computes ``x @ weight.T``: ``prepare`` turns each weight, once
    at load, into what the kernel reads; ``kernel(x, prepared)`` is the product, in
    ``x``'s dtype. ``name`` says which kernel it is (for reports)."""

    @property
    def name(self) -> str: ...

    def prepare(self, weight: torch.Tensor, /) -> PreparedWeight: ...

    def __call__(self, x: torch.Tensor, prepared: PreparedWeight, /) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class UpcastLinear:
    """``linear(x, w)``: ``F.linear`` for fewer than ``min_rows`` rows of ``x`` (or always,
    when ``min_rows`` is None), else the float32 product, in ``x``'s dtype: on the packed
    float32 copy that ``prepare`` makes when ``packed`` (and ``min_rows`` is set), else on
    blocks converted per call. The packed product converts its input and output as
    ``small_ops`` says (on one thread when small). Up to ``few_rows`` rows of ``x`` (0:
    never) the product of a weight of at most ``few_rows_max_bytes`` bytes instead reads
    the bfloat16 weight itself on the calling thread (``bf16_rows``, by ``rows``: numba's
    loop or the compiled kernel; bfloat16 CPU weights only)."""

    min_rows: int | None
    packed: bool = False
    small_ops: SmallOps = NO_SMALL_OPS
    few_rows: int = 0
    few_rows_max_bytes: int = 0
    rows: RowsProduct = NUMBA_ROWS

    @property
    def name(self) -> str:
        """``"plain"`` (torch's product), ``"upcast"`` or ``"upcast-packed"``."""
        if self.min_rows is None:
            return "plain"
        return "upcast-packed" if self.packed else "upcast"

    def prepare(self, weight: torch.Tensor) -> PreparedWeight:
        packed = pack_float32(weight) if self.packed and self.min_rows is not None else None
        return PreparedWeight(weight, packed, _few_rows_bits(self, weight))

    def __call__(self, x: torch.Tensor, prepared: PreparedWeight) -> torch.Tensor:
        if prepared.bits is not None and x.shape[0] <= self.few_rows:
            return self.rows(x, prepared.plain, prepared.bits)
        if self.min_rows is None or x.shape[0] < self.min_rows:
            return F.linear(x, prepared.plain)
        if prepared.packed is not None:
            return packed_upcast_linear(x, prepared.packed, self.small_ops)
        return upcast_linear(x, prepared.plain)


def upcast_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` computed in float32 (exact upcasts, float32 accumulation) over row
    blocks of ``weight``; ``x`` is ``[rows, in]``, the result ``[rows, out]`` in ``x.dtype``."""
    x32 = x.to(torch.float32)
    num_out, num_in = weight.shape
    block = max(_MIN_BLOCK_ROWS, _BLOCK_BYTES // (4 * num_in))
    if block >= num_out:
        return F.linear(x32, weight.to(torch.float32)).to(x.dtype)
    out = torch.empty(x.shape[0], num_out, dtype=x.dtype, device=x.device)
    for start in range(0, num_out, block):
        part = weight[start : start + block].to(torch.float32)
        out[:, start : start + block] = F.linear(x32, part)
    return out


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The memory the kernel says new allocations can take without swapping
    (``MemAvailable``), or None where it does not say."""
    value = proc_field(meminfo, "MemAvailable:")
    return None if value is None else int(value.split()[0]) * 1024


def float32_copies_fit(weight_bytes: int, dtype: torch.dtype, available_bytes: int | None) -> bool:
    """Whether float32 copies of ``weight_bytes`` of ``dtype`` weights take at most half of
    ``available_bytes`` (unknown: assumed not), leaving the rest for the KV cache and
    activations."""
    if available_bytes is None:
        return False
    copies = weight_bytes * 4 // dtype.itemsize
    return 2 * copies <= available_bytes


def pack_float32(weight: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``weight`` (exact upcast) in oneDNN's blocked layout, for
    ``packed_upcast_linear``. Raises RuntimeError where oneDNN cannot pack float32 weights
    (see ``packing_supported``)."""
    return _onednn_reorder(weight.to(torch.float32))


def packed_upcast_linear(
    x: torch.Tensor, packed: torch.Tensor, small_ops: SmallOps = NO_SMALL_OPS
) -> torch.Tensor:
    """``x @ weight.T`` computed in float32 from ``pack_float32(weight)`` (``x`` upcast
    exactly, float32 accumulation in oneDNN's order), the result in ``x.dtype``; the two
    conversions run as ``small_ops`` says."""
    with small_ops.one_thread(x.numel()):
        x32 = x.to(torch.float32)
    out = _onednn_linear(x32, packed)
    with small_ops.one_thread(out.numel()):
        return out.to(x.dtype)


def _onednn_reorder(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered into oneDNN's blocked layout (RuntimeError where it cannot)."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
    return packed


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` by oneDNN from ``_onednn_reorder(weight)``, in their dtype."""
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        x.contiguous(), packed, None, "none", [], ""
    )
    return out


def measure_upcast_min_rows(
    weight: torch.Tensor,
    clock: Clock = time.perf_counter,
    repeats: int = 3,
    *,
    packed: bool = False,
) -> int | None:
    """The fewest rows from which the float32 product of ``weight`` (on a packed float32
    copy when ``packed``, else converted block by block) beats ``F.linear`` at every probed
    row count (``PROBE_ROWS``), or None when it never does from some point on. Each side's
    time is its best of ``repeats`` runs, interleaved, so a busy machine slows both alike.
    float32 weights need no upcast (None)."""
    if weight.dtype == torch.float32:
        return None
    product: Callable[[Sequence[torch.Tensor]], torch.Tensor]
    if packed:
        copy = pack_float32(weight)
        product = lambda xs: packed_upcast_linear(xs[0], copy)  # noqa: E731
    else:
        product = lambda xs: upcast_linear(xs[0], weight)  # noqa: E731
    wins = [_faster_than_torch([weight], rows, product, clock, repeats) for rows in PROBE_ROWS]
    min_rows = None
    for rows, win in zip(reversed(PROBE_ROWS), reversed(wins), strict=True):
        if not win:
            break
        min_rows = rows
    return min_rows


def measure_few_rows_max_bytes(
    kernel: FewRowsKernel,
    groups: Sequence[Sequence[torch.Tensor]],
    clock: Clock = time.perf_counter,
    repeats: int = 3,
) -> int:
    """Up to how many bytes a bfloat16 weight's one-row product is faster read by
    ``bf16_rows`` (``kernel.rows``) on the calling thread than by ``kernel``: each group
    (weights of one size, such as one projection of every layer) is timed at one row over a
    pass of the group, each side its best of ``repeats`` interleaved passes (``kernel``'s
    first); the answer is the size of the largest group up to which ``bf16_rows`` wins at
    every group, 0 when it loses at the smallest."""
    most = 0
    with torch.inference_mode():
        for group in sorted(groups, key=lambda group: group[0].numel()):
            bits = [weight_bits(weight) for weight in group]
            prepared = [kernel.prepare(weight) for weight in group]
            xs = [torch.randn(1, w.shape[1], dtype=w.dtype) for w in group]
            if not beats(
                partial(rows_pass, kernel.rows, xs, group, bits),
                partial(_kernel_pass, kernel, xs, prepared),
                clock, repeats,
            ):  # fmt: skip
                break
            most = group[0].numel() * group[0].element_size()
    return most


def measure_few_rows(
    kernel: FewRowsKernel,
    weights: Sequence[torch.Tensor],
    clock: Clock = time.perf_counter,
    repeats: int = 3,
) -> int:
    """The most rows (of ``FEW_ROWS_PROBE_ROWS``) up to which ``bf16_rows`` (``kernel.rows``),
    reading the bfloat16 weights themselves, is the better choice than ``kernel`` over a pass of one
    product with each of ``weights`` (one kind from every layer, as
    ``measure_packing_wins`` takes them; each no larger than ``few_rows_max_bytes``),
    kernel's product otherwise: the largest probed count at
    which it wins that also wins on the time summed over every probed count up to it (so a
    near tie at one row does not hide a clear win at two). Each side's time is its best of
    ``repeats`` interleaved passes, ``kernel``'s first; 0 where it never wins, and for
    weights that are not bfloat16 on the CPU."""
    if not weights or any(w.dtype != torch.bfloat16 or w.device.type != "cpu" for w in weights):
        return 0
    prepared = [kernel.prepare(weight) for weight in weights]
    bits = [weight_bits(weight) for weight in weights]
    most, summed_bits, summed_kernel = 0, 0.0, 0.0
    with torch.inference_mode():
        for rows in FEW_ROWS_PROBE_ROWS:
            xs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]
            bits_s, kernel_s = best_times(
                partial(rows_pass, kernel.rows, xs, weights, bits),
                partial(_kernel_pass, kernel, xs, prepared),
                clock,
                repeats,
            )
            summed_bits, summed_kernel = summed_bits + bits_s, summed_kernel + kernel_s
            if bits_s < kernel_s and summed_bits < summed_kernel:
                most = rows
    return most


def _kernel_pass(
    kernel: FewRowsKernel, xs: Sequence[torch.Tensor], prepared: Sequence[PreparedWeight]
) -> None:
    for x, weight in zip(xs, prepared, strict=True):
        kernel(x, weight)


@dataclass(frozen=True, slots=True)
class PackedLinear:
    """oneDNN's product on weights reordered once into its blocked layout (see the module
    doc). ``prepare`` needs a CPU tensor and a torch built with oneDNN; it raises
    RuntimeError where the weight's dtype has no oneDNN kernel. As ``UpcastLinear``'s, up
    to ``few_rows`` rows of ``x`` (0: never) the product of a weight of at most
    ``few_rows_max_bytes`` bytes instead reads the bfloat16 weight itself on the calling
    thread (``bf16_rows``, by ``rows``): then the float32 product rounded to bfloat16,
    equal to oneDNN's up to the summation order."""

    few_rows: int = 0
    few_rows_max_bytes: int = 0
    rows: RowsProduct = NUMBA_ROWS

    @property
    def name(self) -> str:
        return "packed"

    def prepare(self, weight: torch.Tensor) -> PreparedWeight:
        return PreparedWeight(weight, _onednn_reorder(weight), _few_rows_bits(self, weight))

    def __call__(self, x: torch.Tensor, prepared: PreparedWeight) -> torch.Tensor:
        if prepared.bits is not None and x.shape[0] <= self.few_rows:
            return self.rows(x, prepared.plain, prepared.bits)
        return _onednn_linear(x, prepared.packed_or_raise())


# The kernels that can hand their products of a few rows to ``bf16_rows``.
FewRowsKernel = UpcastLinear | PackedLinear


def _few_rows_bits(kernel: FewRowsKernel, weight: torch.Tensor) -> npt.NDArray[np.uint16] | None:
    """``weight``'s 16-bit patterns where ``kernel`` reads it by ``bf16_rows``, else None."""
    size = weight.numel() * weight.element_size()
    return weight_bits(weight) if kernel.few_rows and size <= kernel.few_rows_max_bytes else None


def packing_supported(dtype: torch.dtype) -> str | None:
    """None when ``PackedLinear`` can prepare CPU weights of ``dtype`` on this machine, else
    why not: torch without oneDNN, or a CPU without the instructions oneDNN's reduced-
    precision reorder needs (for bfloat16, AVX-512 BW/VL/DQ or AVX-NE-CONVERT). Tried on a
    small weight."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "torch was built without oneDNN"
    try:
        PackedLinear().prepare(torch.zeros(16, 16, dtype=dtype))
    except RuntimeError as error:
        return str(error).strip().splitlines()[0]
    return None


def measure_packing_wins(
    weights: Sequence[torch.Tensor], clock: Clock = time.perf_counter, repeats: int = 3
) -> bool:
    """Whether ``PackedLinear`` beats ``F.linear`` over ``weights`` (one product with each,
    in turn) at every probed row count (``PACKING_PROBE_ROWS``), each side's time its best
    of ``repeats`` interleaved passes. Pass weights of one kind from every layer, as a step
    reads them: a pass over more bytes than the CPU caches hold times the products as a
    step meets them, where one small weight timed again and again is read from cache (on a
    2-core AVX2 CPU such a probe lost at one row where the model's steps ran 1.3x faster
    packed). False off the CPU, for no weights, and where oneDNN has no kernel for their
    dtype. For float32 weights the packed product sums in oneDNN's order, not torch's: the
    same values to rounding."""
    if not weights or any(w.device.type != "cpu" for w in weights):
        return False
    packed = PackedLinear()
    try:
        prepared = [packed.prepare(weight) for weight in weights]
    except RuntimeError:
        return False

    def packed_pass(xs: Sequence[torch.Tensor]) -> None:
        for x, weight in zip(xs, prepared, strict=True):
            packed(x, weight)

    return all(
        _faster_than_torch(weights, rows, packed_pass, clock, repeats)
        for rows in PACKING_PROBE_ROWS
    )


def _faster_than_torch(
    weights: Sequence[torch.Tensor],
    rows: int,
    product: Callable[[Sequence[torch.Tensor]], object],
    clock: Clock,
    repeats: int,
) -> bool:
    """Whether ``product(xs)`` beats ``F.linear(x, weight)`` for each of ``weights`` in
    turn, ``xs`` being ``rows`` random rows for each weight, timed by
    ``interleaved.beats`` (best of ``repeats`` passes, torch's first)."""

    def torch_pass() -> None:
        for x, weight in zip(xs, weights, strict=True):
            F.linear(x, weight)

    with torch.inference_mode():
        xs = [
            torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
            for weight in weights
        ]
        return beats(lambda: product(xs), torch_pass, clock, repeats)

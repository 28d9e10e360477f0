"""``dtype="auto"`` without measuring: bfloat16 where the hardware computes it natively.

A serving worker measures both precisions at start and keeps the faster
(``server.worker.dtype_choice``); every other path (offline profiling, benchmarks, a vLLM
engine, which is too slow to start twice) resolves ``auto`` here: bfloat16 on a CUDA device
that supports it and on CPUs with bfloat16 instructions (``avx512_bf16`` or ``amx_bf16``
in ``/proc/cpuinfo``), float32 otherwise. On a CPU without them torch emulates bfloat16
by conversions, which costs more than the halved memory traffic saves at larger batches.
"""

from __future__ import annotations

from pathlib import Path

from tokenpace.core.procfs import proc_field

AUTO = "auto"
PRECISIONS = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = (AUTO, *PRECISIONS)
# Bytes of one element of each precision (weights, activations, KV cache).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU advertises bfloat16 instructions (False where unknown)."""
    flags = proc_field(cpuinfo, "flags")
    return flags is not None and bool(_CPU_BF16_FLAGS & set(flags.split()))


def resolve_dtype(dtype: str, device_type: str) -> str:
    """``dtype`` itself, or for ``"auto"`` the precision this module's rule picks on a
    ``device_type`` (``"cpu"`` or ``"cuda"``) device. Raises ValueError for an unknown
    name."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    if dtype != AUTO:
        return dtype
    if device_type == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_native_bf16() else "float32"

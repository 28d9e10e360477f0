"""Building the native engine's small C++ kernels once per machine and loading them after.

A kernel's module is built by torch's extension builder (``load_inline``) into a directory
of its own under the build directory and loaded from there by every later process. Its name
covers the source, this CPU's instruction-set flags and torch's version, so that a cache
shared between machines never loads a build made for another CPU or another torch.

Processes that build or load the same kernel at once take turns on an operating-system lock
of the directory (``kernel_build_lock``), which is released however its holder ends. torch's
builder keeps a lock file of its own that a killed build leaves behind, and every later
build or load of that kernel would wait on it forever: under the directory's lock no other
build is running, so such a file is stale and goes.
"""

from __future__ import annotations

import fcntl
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from tokenpace.core.procfs import proc_field

# C++ the kernels share, inside their anonymous namespace (they include <cstdint> and
# <cstring>): ``widen`` (an element as float32), ``put`` (store a float32, rounded to the
# element type) and ``narrow_value`` (a float32 as the element type would store it).
ELEMENT_ACCESS = r"""
// Element access shared by the kernels: float32 as is, bfloat16 as its 16-bit pattern
// (the upper half of a float32: widened exactly, rounded to nearest even when stored).
inline float widen(float v) { return v; }
inline float widen(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline uint32_t rounded_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits + 0x7fffu + ((bits >> 16) & 1u);
}
// The value as the element type stores it, widened back.
inline float narrow_value(float v, const float*) { return v; }
inline float narrow_value(float v, const uint16_t*) {
  const uint32_t bits = rounded_bits(v) & 0xffff0000u;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
inline void put(float* p, int64_t i, float v) { p[i] = v; }
inline void put(uint16_t* p, int64_t i, float v) {
  p[i] = static_cast<uint16_t>(rounded_bits(v) >> 16);
}
"""

Kernel = TypeVar("Kernel")

BUILD_LOCK_FILE = ".tokenpace-build.lock"
TORCH_LOCK_FILE = "lock"  # torch's extension builder's lock file in the build directory


@dataclass(frozen=True)
class KernelBuild(Generic[Kernel]):
    """A built kernel, or None with ``reason`` saying why there is none. (No slots: a slotted
    frozen dataclass cannot be built through a subscripted generic such as
    ``KernelBuild[RaggedDecode](...)``.)"""

    kernel: Kernel | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class CompiledModule:
    """The loaded extension module, or None with ``reason`` saying why there is none."""

    module: Any | None
    reason: str = ""


def module_name(prefix: str, source: str) -> str:
    """``prefix`` and a digest of ``source``, this CPU's flags and torch's version."""
    flags = proc_field(Path("/proc/cpuinfo"), "flags") or ""
    digest = hashlib.sha256((source + flags + torch.__version__).encode()).hexdigest()
    return f"{prefix}_{digest[:16]}"


@dataclass(frozen=True, slots=True)
class CpuKernelSource:
    """A CPU kernel's C++ ``source``, the ``functions`` it exports, its compiler ``cflags``
    (OpenMP is added), the element types it takes (``dtypes``) and ``what`` it is called in
    messages ("the ragged decode kernel")."""

    source: str
    functions: tuple[str, ...]
    cflags: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    what: str


def build_cpu_kernel(
    kernel: CpuKernelSource,
    name: str,
    build_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
) -> CompiledModule:
    """``build_module`` for tensors of ``dtype`` on ``device``: no module, with the reason,
    on a device other than the CPU or for a dtype ``kernel`` does not take."""
    if device.type != "cpu":
        return CompiledModule(None, f"{kernel.what} runs on CPU only, not {device.type}")
    if dtype not in kernel.dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in kernel.dtypes)
        return CompiledModule(None, f"{kernel.what} takes {names}, not {dtype}")
    return build_module(name, kernel, build_dir)


@contextmanager
def kernel_build_lock(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s build lock (exclusive, released when the holder's process ends,
    however it ends); the torch lock file a killed build left there is removed on entry."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / BUILD_LOCK_FILE).open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / TORCH_LOCK_FILE).unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_module(name: str, kernel: CpuKernelSource, build_dir: Path) -> CompiledModule:
    """Build (once: later calls load the cached build from ``build_dir / name``) the
    kernel's C++ source; where building fails (no C++ compiler, say), no module and the
    reason, naming what was built."""
    directory = build_dir / name
    try:
        from torch.utils.cpp_extension import load_inline

        with kernel_build_lock(directory):
            module = load_inline(  # type: ignore[no-untyped-call]
                name,
                cpp_sources=kernel.source,
                functions=list(kernel.functions),
                extra_cflags=[*kernel.cflags, "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                verbose=False,
            )
    except Exception as error:  # any build failure leaves torch's own operations in charge
        lines = str(error).strip().splitlines()
        detail = f": {lines[0]}" if lines else ""
        why = f"building {kernel.what} failed: {type(error).__name__}{detail}"
        return CompiledModule(None, why)
    return CompiledModule(module)

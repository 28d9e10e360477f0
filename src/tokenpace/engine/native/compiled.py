"""Building the native engine's small C++ kernels once per machine and loading them after.

A kernel's module is built by torch's extension builder (``load_inline``) into a directory
of its own under the build directory and loaded from there by every later process. Its name
covers the source, this CPU's instruction-set flags and torch's version, so that a cache
shared between machines never loads a build made for another CPU or another torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenpace.core.procfs import proc_field


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


def build_module(
    name: str,
    source: str,
    functions: list[str],
    build_dir: Path,
    cflags: list[str],
    what: str,
) -> CompiledModule:
    """Build (once: later calls load the cached build from ``build_dir / name``) the C++
    ``source`` exporting ``functions``, compiled with ``cflags`` and OpenMP; where building
    fails (no C++ compiler, say), no module and the reason, naming ``what`` was built."""
    directory = build_dir / name
    try:
        from torch.utils.cpp_extension import load_inline

        directory.mkdir(parents=True, exist_ok=True)
        module = load_inline(  # type: ignore[no-untyped-call]
            name,
            cpp_sources=source,
            functions=functions,
            extra_cflags=[*cflags, "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            verbose=False,
        )
    except Exception as error:  # any build failure leaves torch's own operations in charge
        lines = str(error).strip().splitlines()
        detail = f": {lines[0]}" if lines else ""
        return CompiledModule(None, f"building {what} failed: {type(error).__name__}{detail}")
    return CompiledModule(module)

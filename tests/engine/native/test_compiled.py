"""Building the native engine's C++ kernels: where they cannot run or be built, no kernel
and the reason."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch

from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.native import bf16_rows, elementwise, ragged_attention
from tokenpace.engine.native.compiled import TORCH_LOCK_FILE, kernel_build_lock

pytestmark = pytest.mark.native

KERNELS = default_cache_dir() / "kernels"

# (module, builder, what it builds, the dtypes it takes as its reason names them)
BUILDERS: list[tuple[ModuleType, Callable[..., Any], str, str]] = [
    (
        ragged_attention,
        ragged_attention.build_ragged_decode,
        "the ragged decode kernel",
        "bfloat16 or float32",
    ),
    (elementwise, elementwise.build_elementwise, "the elementwise kernel", "bfloat16 or float32"),
    (bf16_rows, bf16_rows.build_compiled_rows, "the compiled few-rows product", "bfloat16"),
]


@pytest.mark.parametrize(
    ("module", "build", "what", "dtypes"), BUILDERS, ids=["ragged", "elementwise", "rows"]
)
def test_no_kernel_where_it_cannot_run_and_the_reason_is_given(
    module: ModuleType,
    build: Callable[..., Any],
    what: str,
    dtypes: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu = torch.device("cpu")
    half = build(KERNELS, cpu, torch.float16)
    assert half.kernel is None
    assert half.reason == f"{what} takes {dtypes}, not torch.float16"
    meta = build(KERNELS, torch.device("meta"), torch.bfloat16)
    assert meta.kernel is None and meta.reason == f"{what} runs on CPU only, not meta"

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr("torch.utils.cpp_extension.load_inline", no_compiler)
    monkeypatch.setattr(module, "_module_name", lambda: "tokenpace_kernel_missing")
    failed = build(KERNELS, cpu, torch.bfloat16)
    assert failed.kernel is None
    assert failed.reason == (
        f"building {what} failed: RuntimeError: Error building extension: c++: not found"
    )


def test_a_build_killed_midway_does_not_hold_the_next_load_forever() -> None:
    """torch's builder waits on its lock file for as long as the file exists, and a build
    killed mid-way leaves it: the next load of that kernel goes ahead all the same."""
    cpu = torch.device("cpu")
    first = elementwise.build_elementwise(KERNELS, cpu, torch.float32)
    if first.kernel is None:
        pytest.skip(first.reason)
    directory = KERNELS / elementwise._module_name()
    with kernel_build_lock(directory):  # no other build in the directory meanwhile
        (directory / TORCH_LOCK_FILE).touch()  # what a killed build leaves behind
    loaded: list[Any] = []
    worker = threading.Thread(
        target=lambda: loaded.append(elementwise.build_elementwise(KERNELS, cpu, torch.float32)),
        daemon=True,
    )
    worker.start()
    worker.join(timeout=300)
    assert loaded, "the load waited on the lock file of a killed build"
    assert loaded[0].kernel is not None
    assert not (directory / TORCH_LOCK_FILE).exists()

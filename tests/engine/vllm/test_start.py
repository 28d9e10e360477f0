"""Starting an engine in a process that has loaded numba (``start_engine``'s shield)."""

from __future__ import annotations

import importlib

import numpy as np

from tests.policy.test_curve_kernel import taught
from tokenpace.engine.vllm.start import shield_llvmlite_from_kernel_scan


def test_llvmlites_handle_reads_as_an_object_without_attributes_once_shielded() -> None:
    estimator = taught(compiled=True, extrapolate=False)
    assert estimator.compiled  # numba, and so llvmlite's handle, is loaded
    ffi = importlib.import_module("llvmlite.binding.ffi")
    shield_llvmlite_from_kernel_scan()
    # What vLLM's kernel scan reads of every module attribute that has a __dict__.
    assert vars(ffi.lib).get("kernel") is None
    # llvmlite and the compiled loop still work.
    prompts, produced, caps = np.array([50, 200, 2500]), np.full(3, 30), np.full(3, 600)
    in_numpy = taught(compiled=False, extrapolate=False)
    expected = in_numpy.remaining(prompts, produced, caps)
    assert np.array_equal(estimator.remaining(prompts, produced, caps), expected)

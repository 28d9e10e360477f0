"""Where tokenpace keeps what it computes once per machine (measured capacities, ...)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$TOKENPACE_CACHE_DIR`` if set, else ``tokenpace`` under ``$XDG_CACHE_HOME`` (default
    ``~/.cache``). Read from ``environ`` (default: the process environment); nothing is
    created."""
    env = os.environ if environ is None else environ
    if env.get("TOKENPACE_CACHE_DIR"):
        return Path(env["TOKENPACE_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tokenpace"


def age_s(path: Path, now_s: float) -> float | None:
    """Seconds since ``path`` was last written, at ``now_s`` (seconds since the epoch, the
    clock file times use); None when there is no such file."""
    try:
        return now_s - path.stat().st_mtime
    except FileNotFoundError:
        return None


def stale_reason(path: Path, max_age_s: float, now_s: float) -> str | None:
    """Why the cached file at ``path`` must be made again at ``now_s`` (``age_s``): none is
    cached, or it is older than ``max_age_s``; None while it is fresh enough."""
    age = age_s(path, now_s)
    if age is None:
        return "none cached"
    if age > max_age_s:
        return f"the cached one is {age / 3600:.1f} h old"
    return None

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

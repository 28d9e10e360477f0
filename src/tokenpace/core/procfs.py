"""Facts the Linux kernel publishes about this machine in ``/proc`` text files."""

from __future__ import annotations

from pathlib import Path


def proc_field(path: Path, key: str) -> str | None:
    """The value of the first line of ``path`` that starts with ``key`` (the text after its
    first colon, stripped), or None where the file cannot be read or has no such line.
    ``proc_field(Path("/proc/meminfo"), "MemAvailable")`` is ``"1024 kB"`` or the like."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key):
            return line.split(":", 1)[-1].strip()
    return None

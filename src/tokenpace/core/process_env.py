"""Environment defaults a tokenpace process sets once, at its entry point.

Library functions never change ``os.environ``; the command line (``tokenpace``) and each
engine worker process call ``apply_process_defaults`` before anything reads these
variables. A value the user already set always wins.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

PROCESS_DEFAULTS: Mapping[str, str] = {
    # Models load from local files only: nothing is fetched from a hub at run time.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def apply_process_defaults(environ: MutableMapping[str, str]) -> None:
    """Set each of ``PROCESS_DEFAULTS`` in ``environ`` (the process environment at an entry
    point) unless it is already set."""
    for name, value in PROCESS_DEFAULTS.items():
        environ.setdefault(name, value)

"""``tokenpace serve`` (and ``python -m tokenpace.server``): the OpenAI-compatible server."""

from __future__ import annotations

from tokenpace.cli.spec import UsageError
from tokenpace.server.options import ServeOptions


def run(options: ServeOptions) -> None:
    """Start the server and block until it shuts down; a bad setting or an engine that
    cannot start is a ``UsageError``."""
    from tokenpace.server.main import EngineStartError, serve

    try:
        serve(options)
    except (ValueError, FileNotFoundError, EngineStartError) as error:
        raise UsageError(str(error)) from None

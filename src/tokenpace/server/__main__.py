"""``python -m tokenpace.server [flags]``: the same as ``tokenpace serve``."""

from __future__ import annotations

import sys

from tokenpace.server.cli_args import parse_options
from tokenpace.server.main import EngineStartError, serve


def main() -> None:
    try:
        options = parse_options()
        serve(options)
    except (ValueError, FileNotFoundError, EngineStartError) as error:
        print(f"tokenpace serve: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

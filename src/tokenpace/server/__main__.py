"""``python -m tokenpace.server [flags]``: the same as ``tokenpace serve``."""

from __future__ import annotations

import sys

from tokenpace.cli import main

if __name__ == "__main__":
    main(["serve", *sys.argv[1:]])

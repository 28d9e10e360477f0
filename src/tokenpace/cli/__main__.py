"""``python -m tokenpace.cli``: the same as ``tokenpace``."""

from tokenpace.cli import main

main()

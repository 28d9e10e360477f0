"""The public Python API; ``tokenpace`` re-exports everything listed in its ``__all__``."""

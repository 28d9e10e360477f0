"""Offline profiling: sweep a real engine, fit the latency model, write a simulator profile."""

from tokenpace.profiling.run import run_profile

__all__ = ["run_profile"]

"""Engines: mechanism that runs one step for a plan and owns the KV cache."""

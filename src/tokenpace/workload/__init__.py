"""Workloads: arrival processes, length distributions, prompt sources, named experiments."""

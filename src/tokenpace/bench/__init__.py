"""The benchmark matrix (schedulers x workloads x seeds), its results files and report."""

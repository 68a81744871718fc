"""Benchmarks: each module prints a table with ratios against a baseline measured in the same run."""

"""Benchmarks behind `lhc-bench`: each prints one JSON object per measured case."""

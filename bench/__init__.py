"""Benchmarks: `python -m bench` runs every `bench_*.py` module (see `bench.harness`)."""

"""Benchmarks: each module runs with `python -m bench.NAME`; see bench/README.md."""

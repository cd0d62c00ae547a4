"""Micro-benchmarks that guard a hot path; bench/README.md says what each measures."""

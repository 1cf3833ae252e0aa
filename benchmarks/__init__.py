"""Benchmark scripts (each runs standalone and writes benchmarks/results/<name>.json); run_all runs them all."""

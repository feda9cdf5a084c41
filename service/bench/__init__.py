"""Benchmarks that print numbers with the run identity (never timed tests)."""

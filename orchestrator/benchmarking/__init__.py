"""Benchmarking a running server: the bench client and its report (tables, plots)."""

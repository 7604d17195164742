"""Benchmarks: a fast fake upstream, a bare forwarder baseline, a load generator and `bench/run.py`."""

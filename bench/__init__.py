"""Benchmarks of ipvsproxy: a synthetic cluster generator and host-side (no kernel) measurements."""

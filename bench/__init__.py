"""Benchmarks of ipvsproxy: host-side (no kernel) and kernel-lab measurements of a synthetic cluster
(``lab.cluster.synthetic``)."""

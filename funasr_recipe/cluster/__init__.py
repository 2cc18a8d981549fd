"""Cluster operations before and around training: preflight across nodes, communication profiles."""

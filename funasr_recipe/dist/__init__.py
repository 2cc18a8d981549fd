"""Work over every process of every node: rank slicing, markers, node check-in and heartbeats, and
the preflight across nodes before training (agreement, shared dirs, bandwidth, communication profiles)."""

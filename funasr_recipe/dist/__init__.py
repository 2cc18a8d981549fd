"""Work over every process of every node without a process group: rank slicing, markers, node check-in."""

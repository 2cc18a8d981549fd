"""What a run hands to people: training curves and their tables."""

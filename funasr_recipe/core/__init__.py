"""What every stage shares: log lines with node and rank, progress, command-line conventions, rejections."""

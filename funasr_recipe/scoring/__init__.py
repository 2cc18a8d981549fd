"""Error rates, decode dirs (what decoding hands to scoring), per-set scores and RESULTS.md."""

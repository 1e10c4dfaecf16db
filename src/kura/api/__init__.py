"""HTTP protocols: one module per client protocol, plus probes and the error table."""

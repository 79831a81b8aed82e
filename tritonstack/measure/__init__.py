"""The measurement engine the tools share: load loops (closed, open, saturation,
capacity under an SLO) and their settings, interleaved rounds, MLPerf LoadGen's
adaptors, what a server spends (CPU, memory), Triton's trace split, the ideal queue,
and the registry of every figure the tools write (`.figures`)."""

"""The policy schedule_kernels applies, one module per decision: where each node
runs (loops), 2-d tiles (tiling), split reductions (split), launch configs
(launch), loop nests and their threads (nest, threads), streaming stores
(streams) and what r-loops keep per row (rows).  Each reads the target's frozen
traits, never its name."""

"""The policy schedule_kernels applies, one module per decision: where each node
runs (loops), 2-d tiles (tiling), split reductions (split) and launch configs
(launch).  Each reads the target's frozen traits, never its name."""

"""Request state, admission and batching, and the per-rank scheduler loop."""

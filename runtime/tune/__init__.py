"""Per-node tuning: `pagoda tune` measures kernels and the engine, and writes a tuned profile."""

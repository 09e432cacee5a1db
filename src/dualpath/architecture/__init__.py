"""Model architecture math (no PyTorch): KV bytes and FLOPs derived from a `ModelSpec`."""

"""Batching strategies: static (FasterTransformer-style) and iteration-level (Orca)."""

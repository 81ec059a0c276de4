"""Pluggable serving strategies: batching, KV cache management, head layouts, weights, decoding."""

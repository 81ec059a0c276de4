"""KV cache strategies: contiguous slabs and paged blocks."""

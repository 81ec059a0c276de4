"""Attention and matrix kernels: Triton kernels beside their PyTorch references, and dispatch."""

"""Model loaders: GGUF files, Hugging Face checkpoint folders, and random weights for named shapes.

Only safetensors and GGUF are read; nothing is ever unpickled.
"""

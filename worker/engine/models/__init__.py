"""Model families: configuration from GGUF metadata (config.py) and the forward passes."""

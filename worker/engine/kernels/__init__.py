"""GPU kernels as plain functions that record dispatches into a Recording:
weights as DeviceTensors in their GGUF block format (tensor.py), matrix products and row
lookup over them (matmul.py), and the elementwise, norm, RoPE and attention ops."""

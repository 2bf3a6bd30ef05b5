"""The GGUF weight types the engine runs, and their row sizes. Every weight kernel has a variant
for each of these types (shaders/variants.toml entries with `weight_types = true`), and a model
file with any other type is refused when it is read."""
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

WEIGHT_TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.MXFP4)
# The block-quantized ones: the kernels over integer quants (8-bit activations) take these
# (variants.toml `weight_types = "quantized"`).
QUANTIZED_TYPES = tuple(t for t in WEIGHT_TYPES if t not in (T.F32, T.F16, T.BF16))


def row_bytes(ggml_type: T, cols: int) -> int:
    """Bytes of one row of `cols` values (a whole number of the type's blocks)."""
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    return cols // block * type_size

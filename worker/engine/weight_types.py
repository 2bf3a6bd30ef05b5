"""The GGUF weight types the engine runs, and their row sizes. Every weight kernel has a variant
for each of these types (shaders/variants.toml entries with `weight_types = true`), and a model
file with any other type is refused when it is read (and flagged by the web app's model list)."""
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

from vkllm import modelsupport

WEIGHT_TYPES = tuple(T[name] for name in modelsupport.WEIGHT_TYPES)   # the web app's model list shares them
# The block-quantized ones: the kernels over integer quants (8-bit activations) take these
# (variants.toml `weight_types = "quantized"`).
QUANTIZED_TYPES = tuple(t for t in WEIGHT_TYPES if t not in (T.F32, T.F16, T.BF16))


def row_bytes(ggml_type: T, cols: int) -> int:
    """Bytes of one row of `cols` values (a whole number of the type's blocks)."""
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    return cols // block * type_size

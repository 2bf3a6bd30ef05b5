"""Quantization mixes: which type each tensor gets, after llama.cpp's llama_tensor_get_type.

A mix is a function (n_layer, has_output) -> pick(tensor, layer, row_length) -> type. The named
k-quant mixes follow llama.cpp (more bits for attn_v/ffn_down in the layers `use_more_bits`
selects, Q6_K for the output matrix, or for token_embd when it doubles as the output); any
single type name is a uniform mix, which tests use to cover every block format. 1-D tensors
(norms, biases) stay F32 and are not asked. Expert tensors (`ffn_down_exps`, ...) are typed as
their dense counterparts, except in MXFP4_MOE (llama.cpp's gpt-oss files): MXFP4 experts, Q8_0
elsewhere. Rows whose length is not a multiple of the type's
block fall back as llama.cpp does (IQ4_NL, which we do not run, is replaced by Q4_0).
"""
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType as F

from worker.engine.weight_types import WEIGHT_TYPES

FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
            T.Q4_0: T.F16, T.Q4_1: T.F16, T.Q5_0: T.F16, T.Q5_1: T.F16, T.Q8_0: T.F16,
            T.MXFP4: T.F16}

UNIFORM = tuple(t.name for t in WEIGHT_TYPES)

_FILE_TYPES = {"Q4_K_M": F.MOSTLY_Q4_K_M, "Q5_K_M": F.MOSTLY_Q5_K_M, "Q3_K_L": F.MOSTLY_Q3_K_L,
               "F32": F.ALL_F32, "F16": F.MOSTLY_F16, "BF16": F.MOSTLY_BF16,
               "Q4_0": F.MOSTLY_Q4_0, "Q4_1": F.MOSTLY_Q4_1, "Q5_0": F.MOSTLY_Q5_0,
               "Q5_1": F.MOSTLY_Q5_1, "Q8_0": F.MOSTLY_Q8_0, "Q2_K": F.MOSTLY_Q2_K,
               "Q3_K": F.MOSTLY_Q3_K_S, "Q4_K": F.MOSTLY_Q4_K_S, "Q5_K": F.MOSTLY_Q5_K_S,
               "Q6_K": F.MOSTLY_Q6_K, "MXFP4": F.MOSTLY_MXFP4_MOE,
               "MXFP4_MOE": F.MOSTLY_MXFP4_MOE}


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of layers that get a bigger type in the _M mixes."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def fit(qtype: T, k: int) -> T:
    while k % GGML_QUANT_SIZES[qtype][0]:
        qtype = FALLBACK[qtype]
    return qtype


def _k_mix(base: T, more: T, q3_k_l: bool = False):
    def mix(n_layer: int, has_output: bool):
        def pick(tensor: str, layer: int, k: int) -> T:
            if tensor == "output" or (tensor == "token_embd" and not has_output):
                qtype = T.Q6_K
            elif q3_k_l and tensor.removesuffix("_exps") in ("attn_v", "ffn_down", "attn_output"):
                qtype = T.Q5_K
            elif tensor.removesuffix("_exps") in ("attn_v", "ffn_down") and use_more_bits(layer, n_layer):
                qtype = more
            else:
                qtype = base
            return fit(qtype, k)
        return pick
    return mix


def _legacy_mix(base: T, output: T):
    def mix(n_layer: int, has_output: bool):
        def pick(tensor: str, layer: int, k: int) -> T:
            big_out = tensor == "output" or (tensor == "token_embd" and not has_output)
            return fit(output if big_out else base, k)
        return pick
    return mix


def _mxfp4_moe(n_layer: int, has_output: bool):
    return lambda tensor, layer, k: fit(T.MXFP4 if tensor.endswith("_exps") else T.Q8_0, k)


def _uniform(qtype: T):
    return lambda n_layer, has_output: lambda tensor, layer, k: fit(qtype, k)


MIXES = {
    **{name: _uniform(T[name]) for name in UNIFORM},
    "Q4_K_M": _k_mix(T.Q4_K, T.Q6_K),
    "Q5_K_M": _k_mix(T.Q5_K, T.Q6_K),
    "Q3_K_L": _k_mix(T.Q3_K, T.Q3_K, q3_k_l=True),
    "Q4_0": _legacy_mix(T.Q4_0, T.Q6_K),    # llama.cpp's Q4_0 keeps a Q6_K output
    "MXFP4_MOE": _mxfp4_moe,
}


def file_type(mix: str) -> int:
    return int(_FILE_TYPES[mix])

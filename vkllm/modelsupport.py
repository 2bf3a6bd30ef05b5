"""What a model file needs for the engine to serve it, shared by the engine (which refuses any
other file when it opens it) and the web app's model list (which flags such a file from its
header): the architectures (`FAMILIES`, `general.architecture` -> what every file of that
family has), the weight types, and the one-line reasons a file is refused. Standard library
only: the web app reads headers without the engine or Vulkan."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """What every file of an architecture has."""
    rope_neox: bool = False    # NeoX rotation (x_i, x_i+d/2) rather than adjacent pairs (x0, x1)
    qkv_bias: bool = False     # q/k/v biases required (a file of another family may still carry them)
    qk_norm: bool = False      # RMSNorm over each head of q and k before RoPE
    embd_scale: bool = False   # token embeddings multiplied by sqrt(n_embd)
    post_norms: bool = False   # RMSNorm of the attention and FFN outputs before each residual add
    gelu: bool = False         # GeGLU (GELU-tanh gate) rather than SwiGLU
    swa_pattern: int = 0       # layers per group of local layers + one global (0: no sliding window)
    rope_base_swa: float | None = 10000.0  # RoPE base of local layers unless the file says (None: the global one)
    swa_rope_scaled: bool = False  # local layers have the file's rope scaling too (else a rope_freqs tensor only)
    # layer counts of the family's models whose attention scores are scaled by
    # (n_embd / n_head)^-0.5 instead of head_dim^-0.5 (Gemma 3 27B's query_pre_attn_scalar;
    # llama.cpp picks it by the same layer count)
    embd_per_head_scale_layers: tuple[int, ...] = ()
    experts: bool = False      # mixture-of-experts FFN (router + expert tensors)
    expert_norm: bool = False  # the chosen experts' softmax weights renormalised to sum 1
    expert_softmax_chosen: bool = False  # softmax over the chosen logits only (gpt-oss)
    oai: bool = False          # gpt-oss: biases everywhere, clamped SwiGLU, attention sinks
    shared_expert: bool = False  # a sigmoid-gated shared expert besides the chosen ones (Qwen2-MoE)


FAMILIES: dict[str, Family] = {
    "llama": Family(),                               # Llama 2/3.x, Mistral, SmolLM2, TinyLlama
    "qwen2": Family(rope_neox=True, qkv_bias=True),  # Qwen2/2.5, DeepSeek-R1-Distill-Qwen
    "qwen3": Family(rope_neox=True, qk_norm=True),   # Qwen3 (dense)
    "gemma3": Family(rope_neox=True, qk_norm=True, embd_scale=True, post_norms=True, gelu=True,
                     swa_pattern=6, embd_per_head_scale_layers=(62,)),  # Gemma 3 (text)
    "qwen2moe": Family(rope_neox=True, qkv_bias=True, experts=True, shared_expert=True),  # Qwen1.5-MoE, Qwen2-57B-A14B
    "qwen3moe": Family(rope_neox=True, qk_norm=True, experts=True, expert_norm=True),  # Qwen3-30B-A3B, 235B-A22B
    "gpt-oss": Family(rope_neox=True, qkv_bias=True, swa_pattern=2, rope_base_swa=None, swa_rope_scaled=True,
                      experts=True, expert_softmax_chosen=True, oai=True),     # gpt-oss-20b, 120b
}

# GGUF tensor types (gguf.GGMLQuantizationType names) the engine's weight kernels have variants for
WEIGHT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4")


def unsupported_architecture(arch) -> str | None:
    """Why a file of architecture `arch` cannot be served, or None if it can."""
    if arch in FAMILIES:
        return None
    return f"unsupported architecture {arch!r} (supported: {', '.join(FAMILIES)})"


def unsupported_type(tensor: str, type_name: str) -> str | None:
    """Why a tensor of type `type_name` cannot be served, or None if it can."""
    if type_name in WEIGHT_TYPES:
        return None
    return f"tensor '{tensor}' has unsupported type {type_name} (supported: {', '.join(sorted(WEIGHT_TYPES))})"


def tensor_data_problem(ranges, data_start: int, file_size: int, alignment: int) -> str | None:
    """Why tensors at `ranges` ((offset from data_start, bytes, name), ...) do not fit a file of
    `file_size` bytes, or None. A truncated file (tensors laid out back to back, the last ones cut
    off) is told from a tensor whose offset points outside the file."""
    expected = 0
    contiguous = True
    for offset, size, _ in sorted(ranges):
        contiguous &= offset == expected
        expected = -(-(offset + size) // alignment) * alignment
    for offset, size, name in ranges:
        end = data_start + offset + size
        if end <= file_size:
            continue
        if contiguous:
            need = data_start + max(o + s for o, s, _ in ranges)
            return f"truncated file: {file_size} bytes, but its tensor data needs {need}"
        return (f"tensor '{name}' data (bytes {data_start + offset}..{end}) lies outside "
                f"the file ({file_size} bytes)")
    return None

"""Model hyperparameters as one frozen dataclass filled from GGUF metadata.

What differs between families is a flag on the config, which the one forward pass
(models/model.py) reads. FAMILIES maps `general.architecture` to what the family's files always
have (Mistral and SmolLM2 files say `llama`; Qwen2 = Llama + q/k/v biases + NeoX RoPE; Qwen3 =
NeoX RoPE + per-head q/k RMSNorm); what a file may have besides (q/k/v biases in a `llama` file,
tied embeddings, rope factors) is read from its tensors.

RoPE frequency factors: llama.cpp divides each rotation frequency by `rope_freqs.weight`
(written by convert_hf_to_gguf.py for Llama 3.1/3.2 "llama3" rope scaling), so that tensor is
the source of truth. GGUF has no keys for the llama3 parameters; a file without the tensor but
with `rope.scaling.type = linear` gets a constant factor (the same maths as position scaling).
`llama3_rope_factors` is the conversion script's formula, used to write synthetic files.
"""
import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
from gguf.quants import dequantize

from worker.engine.errors import GGUFError


def llama3_rope_factors(head_dim: int, base: float, factor: float, low_freq_factor: float,
                        high_freq_factor: float, original_context: int) -> tuple[float, ...]:
    """Per-frequency divisors of Llama 3.1 rope scaling (convert_hf_to_gguf.py, LlamaModel)."""
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(float(factor))
        else:
            smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


@dataclass(frozen=True)
class Family:
    """What every file of an architecture has."""
    rope_neox: bool = False    # NeoX rotation (x_i, x_i+d/2) rather than adjacent pairs (x0, x1)
    qkv_bias: bool = False     # q/k/v biases required (a file of another family may still carry them)
    qk_norm: bool = False      # RMSNorm over each head of q and k before RoPE


FAMILIES: dict[str, Family] = {
    "llama": Family(),                               # Llama 2/3.x, Mistral, SmolLM2, TinyLlama
    "qwen2": Family(rope_neox=True, qkv_bias=True),  # Qwen2/2.5, DeepSeek-R1-Distill-Qwen
    "qwen3": Family(rope_neox=True, qk_norm=True),   # Qwen3 (dense)
}

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int
    rope_base: float
    rope_freq_factors: tuple[float, ...] | None
    norm_eps: float
    context_length: int
    vocab_size: int
    tied_embeddings: bool
    has_qkv_bias: bool
    has_qk_norm: bool
    rope_neox: bool

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any] | None = None):
        """Config of the file's family. `tensors` (name -> TensorInfo) decides tied embeddings,
        optional biases and rope_freqs; without it the file is assumed to have neither."""
        arch = meta.get("general.architecture")
        family = FAMILIES.get(arch)
        if family is None:
            raise GGUFError(f"unsupported architecture {arch!r} (supported: {', '.join(FAMILIES)})")
        try:
            return cls._build(arch, family, meta, tensors or {})
        except (TypeError, ValueError) as e:
            raise GGUFError(f"bad {arch} metadata: {e}") from None

    @classmethod
    def _build(cls, arch: str, family: Family, meta, tensors):

        def key(name, default=None):
            value = meta.get(f"{arch}.{name}", default)
            if value is None:
                raise GGUFError(f"metadata key '{arch}.{name}' is missing")
            return value

        n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", n_embd // n_head))
        vocab = key("vocab_size", len(meta.get("tokenizer.ggml.tokens", ())) or None)
        has_bias = family.qkv_bias or "blk.0.attn_q.bias" in tensors
        return cls(
            arch=arch, name=str(meta.get("general.name", "")),
            n_layer=int(key("block_count")), n_embd=n_embd, n_ff=int(key("feed_forward_length")),
            n_head=n_head, n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim=head_dim, rope_dim=int(key("rope.dimension_count", head_dim)),
            rope_base=float(key("rope.freq_base", 10000.0)),
            rope_freq_factors=_rope_factors(meta, arch, tensors, head_dim),
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            context_length=int(key("context_length")), vocab_size=int(vocab),
            tied_embeddings="output.weight" not in tensors, has_qkv_bias=has_bias,
            has_qk_norm=family.qk_norm, rope_neox=family.rope_neox)

    def required_tensors(self) -> list[str]:
        per_layer = list(LAYER_TENSORS)
        if self.has_qkv_bias:
            per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
        if self.has_qk_norm:
            per_layer += ["attn_q_norm", "attn_k_norm"]
        names = ["token_embd.weight", "output_norm.weight"]
        names += [f"blk.{i}.{t}" if t.endswith(".bias") else f"blk.{i}.{t}.weight"
                  for i in range(self.n_layer) for t in per_layer]
        return names

    def check_tensors(self, tensors: Mapping[str, Any]) -> None:
        """Raise GGUFError naming the first required tensor the file lacks."""
        for name in self.required_tensors():
            if name not in tensors:
                raise GGUFError(f"required tensor '{name}' is missing ({self.arch} model)")

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _rope_factors(meta, arch, tensors, head_dim) -> tuple[float, ...] | None:
    freqs = tensors.get("rope_freqs.weight")
    if freqs is not None:
        values = dequantize(freqs.data, freqs.ggml_type)
        return tuple(float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1))
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    if kind == "none" or factor == 1.0:
        return None
    if kind == "linear":
        return (factor,) * (head_dim // 2)
    raise GGUFError(f"unsupported rope scaling type {kind!r}")

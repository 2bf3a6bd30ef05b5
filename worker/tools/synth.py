"""Synthetic GGUF models: random weights in the exact shapes of real models (for benchmarks and
memory plans) or tiny ones (for tests), quantized with llama.cpp-like mixes.

Weights are normal with std gain/sqrt(row length), so every matmul keeps activations near unit
scale whatever the width (0.016-0.02 for 4096-8192 wide models); norms are near 1. Files are
written tensor by tensor (GGUFWriter's tensor-info-first API) and each tensor is generated and
quantized in row chunks on all cores, so a 70B file needs about one tensor of memory. Chunk i
of tensor t draws from default_rng([seed, t, i]): the output does not depend on thread count.
"""
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, RopeScalingType

from worker.engine.intmath import cdiv
from worker.engine.models.config import FAMILIES, llama3_rope_factors
from worker.engine.weight_types import row_bytes
from worker.tools.quant import quantize
from worker.tools.synthmix import MIXES, file_type
from worker.tools.synthvocab import CHATML_TEMPLATE, build_vocab


@dataclass(frozen=True)
class Preset:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    context_length: int
    rope_base: float
    norm_eps: float
    tied: bool
    pre: str                                    # tokenizer.ggml.pre
    llama3_rope: tuple | None = None            # (factor, low_freq, high_freq, original_ctx)
    qkv_bias: bool = False                      # q/k/v biases even where the family has none
    sliding_window: int = 0                     # attention.sliding_window (families with local layers)
    rope_linear: float | None = None            # rope.scaling linear factor
    rope_yarn: tuple | None = None              # YaRN rope scaling: (factor, original context length)
    n_expert: int = 0                           # mixture of experts: experts per layer
    n_expert_used: int = 0                      # experts per token
    n_ff_exp: int = 0                           # rows of one expert's gate and up
    n_ff_shexp: int = 0                         # rows of the shared expert's gate and up (qwen2moe)


PRESETS = {
    "llama-3.2-1b": Preset("llama", 16, 2048, 8192, 32, 8, 64, 128256, 131072, 500000.0, 1e-5,
                           True, "llama-bpe", (32.0, 1.0, 4.0, 8192)),
    "llama-3.1-8b": Preset("llama", 32, 4096, 14336, 32, 8, 128, 128256, 131072, 500000.0, 1e-5,
                           False, "llama-bpe", (8.0, 1.0, 4.0, 8192)),
    "llama-3.1-70b": Preset("llama", 80, 8192, 28672, 64, 8, 128, 128256, 131072, 500000.0, 1e-5,
                            False, "llama-bpe", (8.0, 1.0, 4.0, 8192)),
    "qwen2.5-7b": Preset("qwen2", 28, 3584, 18944, 28, 4, 128, 152064, 32768, 1e6, 1e-6,
                         False, "qwen2"),
    "qwen2.5-32b": Preset("qwen2", 64, 5120, 27648, 40, 8, 128, 152064, 32768, 1e6, 1e-5,
                          False, "qwen2"),
    # 3.88e9 parameters, as the text model of Gemma 3 4B (its vision tower is a separate file)
    "gemma-3-4b": Preset("gemma3", 34, 2560, 10240, 8, 4, 256, 262208, 131072, 1e6, 1e-6,
                         True, "llama-bpe", sliding_window=1024, rope_linear=8.0),
    # 30.5e9 parameters (3.3e9 active per token), as Qwen3-30B-A3B
    "qwen3-30b-a3b": Preset("qwen3moe", 48, 2048, 6144, 32, 4, 128, 151936, 40960, 1e6, 1e-6, False, "qwen2",
                            n_expert=128, n_expert_used=8, n_ff_exp=768),
    # 14.3e9 parameters (2.7e9 active), as Qwen1.5-MoE-A2.7B: 60 experts and a shared one
    "qwen1.5-moe-a2.7b": Preset("qwen2moe", 24, 2048, 5632, 16, 16, 128, 151936, 8192, 1e6, 1e-6, False, "qwen2",
                                n_expert=60, n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632),
    # 20.9e9 parameters (3.6e9 active), as gpt-oss-20b, with its YaRN rope scaling
    "gpt-oss-20b": Preset("gpt-oss", 24, 2880, 2880, 64, 8, 64, 201088, 131072, 150000.0, 1e-5, False,
                          "gpt-4o", sliding_window=128, n_expert=32, n_expert_used=4, n_ff_exp=2880,
                          rope_yarn=(32.0, 4096)),
    # Tiny models for tests. tiny-llama's widths are multiples of 256 so k-quants apply
    # everywhere; tiny-qwen2 (128 wide) exercises the llama.cpp fallbacks to 32-blocks;
    # tiny-qwen3 has head_dim * n_head != n_embd, as real Qwen3 models do.
    "tiny-llama": Preset("llama", 2, 256, 768, 4, 2, 64, 384, 2048, 500000.0, 1e-5,
                         False, "llama-bpe", (8.0, 1.0, 4.0, 8192)),
    # A llama file with q/k/v biases: llama.cpp's llama architecture applies them when present.
    "tiny-llama-bias": Preset("llama", 2, 256, 768, 4, 2, 64, 384, 2048, 500000.0, 1e-5,
                              False, "llama-bpe", (8.0, 1.0, 4.0, 8192), qkv_bias=True),
    "tiny-qwen2": Preset("qwen2", 2, 128, 352, 4, 2, 32, 331, 2048, 1e6, 1e-6, False, "qwen2"),
    "tiny-qwen3": Preset("qwen3", 2, 256, 512, 4, 2, 32, 400, 2048, 1e6, 1e-6, True, "qwen2"),
    # Six layers: five local ones over an 8-position window and one global, as Gemma 3's pattern;
    # head_dim * n_head != n_embd as in every Gemma 3.
    "tiny-gemma3": Preset("gemma3", 6, 256, 768, 4, 2, 128, 384, 2048, 1e6, 1e-6, True, "llama-bpe",
                          sliding_window=8),
    # Mixtures of experts: 2 of 8 experts per token; gpt-oss's four layers alternate local (over
    # 8 positions) and global as its pattern does.
    "tiny-qwen3moe": Preset("qwen3moe", 2, 256, 512, 4, 2, 32, 400, 2048, 1e6, 1e-6, False, "qwen2",
                            n_expert=8, n_expert_used=2, n_ff_exp=256),
    # the shared expert 384 rows wide (not the dense feed_forward_length, its default)
    "tiny-qwen2moe": Preset("qwen2moe", 2, 256, 512, 4, 2, 64, 400, 2048, 1e6, 1e-6, False, "qwen2",
                            n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=384),
    "tiny-gpt-oss": Preset("gpt-oss", 4, 256, 256, 4, 2, 64, 384, 2048, 150000.0, 1e-5, False, "llama-bpe",
                           sliding_window=8, n_expert=8, n_expert_used=2, n_ff_exp=256),
    # tiny-gpt-oss with YaRN over a short original context, so that at test lengths the ramp
    # spans a third of the pairs and the rest are interpolated (gpt-oss-20b's is 32 over 4096)
    "tiny-gpt-oss-yarn": Preset("gpt-oss", 4, 256, 256, 4, 2, 64, 384, 2048, 150000.0, 1e-5, False, "gpt-4o",
                                sliding_window=8, n_expert=8, n_expert_used=2, n_ff_exp=256, rope_yarn=(8.0, 256)),
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]        # numpy order: (rows, row length) or (length,)
    qtype: T
    init: Callable[[np.random.Generator, tuple], np.ndarray]


def _normal(gain: float, mean: float = 0.0):
    def init(rng, shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= np.float32(gain / np.sqrt(shape[-1]) if len(shape) > 1 else gain)
        return x + np.float32(mean) if mean else x
    return init


def _std(std: float):
    """Normal values of standard deviation `std` whatever the shape (biases of any rank)."""
    return lambda rng, shape: rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _const(values):
    return lambda rng, shape: np.asarray(values, dtype=np.float32).reshape(shape)


def tensor_specs(p: Preset, mix: str) -> list[TensorSpec]:
    """Every tensor of the model with its type under `mix`, in file order."""
    pick = MIXES[mix](p.n_layer, has_output=not p.tied)
    q_dim, kv_dim = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    norm, bias = _normal(0.1, 1.0), _normal(0.1)
    family = FAMILIES[p.arch]
    specs = [TensorSpec("token_embd.weight", (p.n_vocab, p.n_embd), pick("token_embd", -1, p.n_embd),
                        _normal(3.0))]
    if p.llama3_rope:
        factors = llama3_rope_factors(p.head_dim, p.rope_base, *p.llama3_rope)
        specs.append(TensorSpec("rope_freqs.weight", (p.head_dim // 2,), T.F32, _const(factors)))
    for i in range(p.n_layer):
        def mat(name, rows, k, gain=1.0):
            return TensorSpec(f"blk.{i}.{name}.weight", (rows, k), pick(name, i, k), _normal(gain))

        def vec(name, n, init, suffix="weight"):
            return TensorSpec(f"blk.{i}.{name}.{suffix}", (n,), T.F32, init)

        specs += [vec("attn_norm", p.n_embd, norm),
                  mat("attn_q", q_dim, p.n_embd), mat("attn_k", kv_dim, p.n_embd),
                  mat("attn_v", kv_dim, p.n_embd)]
        if family.qkv_bias or p.qkv_bias:
            specs += [vec("attn_q", q_dim, bias, "bias"), vec("attn_k", kv_dim, bias, "bias"),
                      vec("attn_v", kv_dim, bias, "bias")]
        if family.qk_norm:
            specs += [vec("attn_q_norm", p.head_dim, norm), vec("attn_k_norm", p.head_dim, norm)]
        specs.append(mat("attn_output", p.n_embd, q_dim))
        if family.oai:
            specs += [vec("attn_output", p.n_embd, bias, "bias"), vec("attn_sinks", p.n_head, _normal(1.0))]
        if family.post_norms:
            specs.append(vec("post_attention_norm", p.n_embd, norm))
        specs.append(vec("post_attention_norm" if family.oai else "ffn_norm", p.n_embd, norm))
        specs += _expert_specs(p, i, pick, family.oai, family.shared_expert) if family.experts else \
            [mat("ffn_gate", p.n_ff, p.n_embd), mat("ffn_up", p.n_ff, p.n_embd), mat("ffn_down", p.n_embd, p.n_ff)]
        if family.post_norms:
            specs.append(vec("post_ffw_norm", p.n_embd, norm))
    specs.append(TensorSpec("output_norm.weight", (p.n_embd,), T.F32, norm))
    if not p.tied:
        specs.append(TensorSpec("output.weight", (p.n_vocab, p.n_embd), pick("output", -1, p.n_embd),
                                _normal(3.0)))
    return specs


def _expert_specs(p: Preset, i: int, pick, biases: bool, shared: bool) -> list[TensorSpec]:
    """The router (F32, as llama.cpp's quantizer leaves it) and the 3-D expert tensors
    [n_expert, rows, K], typed as their dense counterparts would be; gpt-oss's biases besides;
    a shared expert (its gate a 1-D F32 row, its FFN typed as a dense one) besides."""
    def experts(name, rows, k):
        return TensorSpec(f"blk.{i}.{name}.weight", (p.n_expert, rows, k), pick(name, i, k), _normal(1.0))

    specs = [TensorSpec(f"blk.{i}.ffn_gate_inp.weight", (p.n_expert, p.n_embd), T.F32, _normal(1.0)),
             experts("ffn_gate_exps", p.n_ff_exp, p.n_embd), experts("ffn_up_exps", p.n_ff_exp, p.n_embd),
             experts("ffn_down_exps", p.n_embd, p.n_ff_exp)]
    if biases:
        # [n_expert, rows] biases stay F32 whatever the mix, as every bias
        specs += [TensorSpec(f"blk.{i}.{name}.bias", shape, T.F32, _std(0.1))
                  for name, shape in (("ffn_gate_inp", (p.n_expert,)), ("ffn_gate_exps", (p.n_expert, p.n_ff_exp)),
                                      ("ffn_up_exps", (p.n_expert, p.n_ff_exp)),
                                      ("ffn_down_exps", (p.n_expert, p.n_embd)))]
    if shared:
        def mat(name, rows, k):
            return TensorSpec(f"blk.{i}.{name}.weight", (rows, k), pick(name, i, k), _normal(1.0))
        specs += [TensorSpec(f"blk.{i}.ffn_gate_inp_shexp.weight", (p.n_embd,), T.F32, _std(p.n_embd ** -0.5)),
                  mat("ffn_gate_shexp", p.n_ff_shexp, p.n_embd), mat("ffn_up_shexp", p.n_ff_shexp, p.n_embd),
                  mat("ffn_down_shexp", p.n_embd, p.n_ff_shexp)]
    return specs


def _tensor_bytes(spec: TensorSpec, index: int, seed: int, pool: ThreadPoolExecutor) -> np.ndarray:
    k = spec.shape[-1]
    rows = int(np.prod(spec.shape[:-1])) if len(spec.shape) > 1 else 1
    out = np.empty((rows, row_bytes(spec.qtype, k)), dtype=np.uint8)
    step = max(1, (1 << 21) // k)

    def chunk(j):
        r0 = j * step
        r1 = min(rows, r0 + step)
        shape = (r1 - r0, k) if len(spec.shape) > 1 else (k,)
        values = spec.init(np.random.default_rng([seed, index, j]), shape)
        out[r0:r1] = quantize(values.reshape(r1 - r0, k), spec.qtype)

    list(pool.map(chunk, range(cdiv(rows, step))))
    return out


def _add_metadata(w: GGUFWriter, name: str, p: Preset, mix: str) -> None:
    w.add_name(name)
    w.add_block_count(p.n_layer)
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.n_embd)
    w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    if p.head_dim * p.n_head != p.n_embd:
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
    w.add_rope_dimension_count(p.head_dim)
    w.add_rope_freq_base(p.rope_base)
    w.add_layer_norm_rms_eps(p.norm_eps)
    if p.sliding_window:
        w.add_sliding_window(p.sliding_window)
    if p.n_expert:
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        w.add_expert_feed_forward_length(p.n_ff_exp)
    if p.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(p.n_ff_shexp)
    if p.rope_linear:
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(p.rope_linear)
    if p.rope_yarn:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(p.rope_yarn[0])
        w.add_rope_scaling_orig_ctx_len(p.rope_yarn[1])
    w.add_vocab_size(p.n_vocab)
    w.add_file_type(file_type(mix))
    w.add_quantization_version(2)
    vocab = build_vocab(p.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(p.pre)
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.token_id("<|endoftext|>"))
    w.add_eos_token_id(vocab.token_id("<|im_end|>"))
    w.add_add_bos_token(p.pre == "llama-bpe")   # Llama 3 adds BOS, Qwen does not
    w.add_chat_template(CHATML_TEMPLATE)


def write_model(preset: str, out: Path, mix: str = "Q4_K_M", seed: int = 0,
                progress: Callable[[str, int], None] | None = None, extra: dict | None = None) -> Path:
    """Write synthetic model `preset` to `out`; `progress(tensor_name, n_bytes)` after each.
    `extra`: more metadata, key -> int (stored int32), float (float32) or str."""
    p = PRESETS[preset]
    specs = tensor_specs(p, mix)
    out = Path(out)
    w = GGUFWriter(out, p.arch)
    _add_metadata(w, f"synthetic {preset} {mix}", p, mix)
    for key, value in (extra or {}).items():
        add = {int: w.add_int32, float: w.add_float32, str: w.add_string}[type(value)]
        add(key, value)
    for s in specs:
        byte_shape = (*s.shape[:-1], row_bytes(s.qtype, s.shape[-1]))
        w.add_tensor_info(s.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                          raw_dtype=s.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        for index, s in enumerate(specs):
            data = _tensor_bytes(s, index, seed, pool)
            w.write_tensor_data(data)
            if progress:
                progress(s.name, data.nbytes)
    w.close()
    return out

"""Model hyperparameters as one frozen dataclass filled from GGUF metadata.

What differs between families is a flag on the config, which the one forward pass
(models/model.py) reads. FAMILIES (vkllm/modelsupport.py, which the web app's model list
shares) maps `general.architecture` to what the family's files always have (Mistral and SmolLM2
files say `llama`; Qwen2 = Llama + q/k/v biases + NeoX RoPE; Qwen3 = NeoX RoPE + per-head q/k
RMSNorm; Gemma 3 = Qwen3 + embeddings scaled by sqrt(n_embd), RMSNorm after attention and after
the FFN too, GeGLU, and sliding-window layers); what a file may have besides (q/k/v biases in a
`llama` file, tied embeddings, rope factors) is read from its tensors.

Sliding-window attention (llama.cpp's "iSWA"): a family with `swa_pattern` has local layers, each
seeing the last `attention.sliding_window` positions, and global ones: layer i is global when
i % pattern == pattern - 1 (Gemma 3: every sixth), unless `attention.sliding_window_pattern`
gives the pattern or a per-layer list. Local layers rotate with their own base
(`rope.freq_base_swa`, default the family's) and without linear rope scaling (llama.cpp applies
the scaled frequency to global layers only; a rope_freqs tensor applies to all).

RoPE frequency factors: llama.cpp divides each rotation frequency by `rope_freqs.weight`
(written by convert_hf_to_gguf.py for Llama 3.1/3.2 "llama3" rope scaling), so that tensor is
the source of truth. GGUF has no keys for the llama3 parameters; a file without the tensor but
with `rope.scaling.type = linear` gets a constant factor (the same maths as position scaling).
`llama3_rope_factors` is the conversion script's formula, used to write synthetic files.

YaRN (`rope.scaling.type = yarn`, gpt-oss): llama.cpp's ggml rope_yarn mixes, per pair i, the
interpolated angle theta * s (s = 1 / rope.scaling.factor) and the original one by a ramp r_i
over the correction dimensions of beta_fast and beta_slow (`rope.scaling.yarn_beta_fast`, _slow;
32 and 1), r_i scaled by ext_factor (1 unless `rope.scaling.yarn_ext_factor`): the angle times
s * (1 - r_i) + r_i, a per-pair divisor like rope_freqs (both apply: the product). It also
multiplies cos and sin by mscale = attn_factor * (1 + 0.1 ln(1/s)) (attn_factor
`rope.scaling.yarn_attn_factor`, 1) when ext_factor is not 0: q and k both grow by mscale, which
only their dot product sees, so the engine folds mscale^2 into the attention score scale.
`Yarn.factors` and `Yarn.mscale` are those; tests/refmodel.py computes rope_yarn itself.

Mixture of experts (llama.cpp's build_moe_ffn): a family with `experts` replaces the dense FFN by
a router (`ffn_gate_inp`, one logit per expert) choosing `expert_used_count` of `expert_count`
experts per token, each a SwiGLU FFN of `expert_feed_forward_length` rows stored as 3-D tensors
[n_expert, rows, K] (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`), their outputs summed with
the router's weights. How the weights come from the logits is the family's, as llama.cpp
hard-codes it per architecture: Qwen3-MoE takes the softmax over all experts and renormalises the
chosen ones to sum 1; gpt-oss softmaxes the chosen logits only. gpt-oss besides: biases on q/k/v,
the attention output, the router and every expert, the clamped SwiGLU of llama.cpp's
swiglu_oai, a learned per-head attention sink, every other layer local (pattern 2) with the
global layers. RoPE base (and rope scaling), and its FFN norm stored as `post_attention_norm`.
Qwen2-MoE (llama.cpp's qwen2moe): Qwen2's attention (q/k/v biases, no q/k norm), the softmax over
all experts taken at the chosen ones and not renormalised, and a shared expert on every layer: a
SwiGLU FFN of `expert_shared_feed_forward_length` rows (`ffn_gate_shexp`, `ffn_up_shexp`,
`ffn_down_shexp`; llama.cpp's default: feed_forward_length) that every token goes through, its
output scaled by sigmoid(ffn_gate_inp_shexp . x), one row, and added to the chosen experts' sum.
"""
import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
from gguf.quants import dequantize

from vkllm.modelsupport import FAMILIES, Family, unsupported_architecture  # noqa: F401 (Family: re-exported)
from worker.engine.errors import GGUFError

MAX_EXPERTS_USED = 32   # experts per token the routing kernel keeps (shaders/moe_route.comp)
MAX_EXPERTS = 512       # experts per layer the grouping kernel counts (shaders/moe_group.comp)


@dataclass(frozen=True)
class Yarn:
    """llama.cpp's YaRN parameters (ggml rope_yarn) for rope_dim dimensions rotated with base."""
    factor: float               # rope.scaling.factor (llama.cpp's freq_scale = 1 / factor)
    original_context: int       # rope.scaling.original_context_length (n_ctx_orig_yarn)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ext_factor: float = 1.0
    attn_factor: float = 1.0

    def corr_dims(self, rope_dim: int, base: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims: the pairs where the ramp starts and ends."""
        def dim(beta):
            return rope_dim * math.log(self.original_context / (beta * 2 * math.pi)) / (2 * math.log(base))
        low, high = math.floor(dim(self.beta_fast)), math.ceil(dim(self.beta_slow))
        return max(0.0, float(low)), min(rope_dim - 1.0, float(high))

    def factors(self, rope_dim: int, base: float) -> tuple[float, ...]:
        """Per-pair divisors of the angle: 1 / (s (1 - r_i) + r_i)."""
        low, high = self.corr_dims(rope_dim, base)
        s, out = 1.0 / self.factor, []
        for i in range(rope_dim // 2):
            r = (1 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))) * self.ext_factor
            out.append(1.0 / (s * (1 - r) + r))
        return tuple(out)

    @property
    def mscale(self) -> float:
        """The magnitude factor of rotated values."""
        return self.attn_factor * (1 + 0.1 * math.log(self.factor)) if self.ext_factor else self.attn_factor


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


ATTENTION_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output")
DENSE_FFN_TENSORS = ("ffn_gate", "ffn_up", "ffn_down")
EXPERT_TENSORS = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SHARED_EXPERT_TENSORS = ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")


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
    embedding_scale: float = 1.0
    has_post_norms: bool = False
    ffn_gelu: bool = False
    sliding_window: int = 0                       # positions a local layer sees (0: none)
    swa_layers: tuple[bool, ...] = ()             # per layer: local (sliding window)
    rope_base_swa: float = 10000.0                # RoPE base of local layers
    rope_freq_factors_swa: tuple[float, ...] | None = None   # rope_freq_factors of local layers
    attention_scale: float | None = None          # score scale; None: head_dim^-0.5
    rope_yarn: Yarn | None = None                 # YaRN rope scaling (its factors are in rope_freq_factors)
    rope_yarn_swa: bool = False                   # local layers rotate with rope_yarn too
    ffn_norm: str = "ffn_norm"                    # the FFN's input norm tensor (gpt-oss: post_attention_norm)
    n_expert: int = 0                             # experts per layer (0: a dense FFN)
    n_expert_used: int = 0                        # experts each token goes through
    n_ff_exp: int = 0                             # rows of one expert's gate and up
    n_ff_shexp: int = 0                           # rows of the shared expert's gate and up (0: none)
    expert_weights_norm: bool = False             # chosen weights renormalised to sum 1
    expert_softmax_chosen: bool = False           # weights: softmax of the chosen logits only
    ffn_oai: bool = False                         # gpt-oss's clamped SwiGLU, expert and router biases
    has_attn_sinks: bool = False                  # a learned logit per head in the softmax denominator
    has_attn_out_bias: bool = False

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], tensors: Mapping[str, Any] | None = None):
        """Config of the file's family. `tensors` (name -> TensorInfo) decides tied embeddings,
        optional biases and rope_freqs; without it the file is assumed to have neither."""
        arch = meta.get("general.architecture")
        problem = unsupported_architecture(arch)
        if problem:
            raise GGUFError(problem)
        family = FAMILIES[arch]
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
        n_layer = int(key("block_count"))
        n_expert = int(key("expert_count")) if family.experts else 0
        n_expert_used = int(key("expert_used_count")) if n_expert else 0
        n_ff_exp = int(key("expert_feed_forward_length")) if n_expert else 0
        n_ff = int(key("feed_forward_length", n_ff_exp or None))
        n_ff_shexp = int(key("expert_shared_feed_forward_length", n_ff)) if family.shared_expert else 0
        if n_expert and not (0 < n_expert_used <= min(n_expert, MAX_EXPERTS_USED) and n_expert <= MAX_EXPERTS):
            raise ValueError(f"{n_expert_used} experts used of {n_expert} (supported: up to {MAX_EXPERTS_USED} "
                             f"of {MAX_EXPERTS})")
        if float(meta.get(f"{arch}.final_logit_softcapping", 0.0) or 0.0) != 0.0:
            raise GGUFError("final logit soft-capping is not supported")
        window, swa_layers = _sliding_window(meta, arch, family, n_layer)
        rope_dim, rope_base = int(key("rope.dimension_count", head_dim)), float(key("rope.freq_base", 10000.0))
        yarn = _yarn(meta, arch)
        factors = _rope_factors(meta, arch, tensors, head_dim, yarn and yarn.factors(rope_dim, rope_base))
        # local layers keep a rope_freqs tensor; the file's scaling only where the family says so
        swa_factors = factors if family.swa_rope_scaled else _rope_factors(meta, arch, tensors, head_dim, None, True)
        return cls(
            arch=arch, name=str(meta.get("general.name", "")),
            n_layer=n_layer, n_embd=n_embd, n_ff=n_ff,
            n_head=n_head, n_head_kv=int(key("attention.head_count_kv", n_head)),
            head_dim=head_dim, rope_dim=rope_dim, rope_base=rope_base,
            rope_freq_factors=factors,
            norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            context_length=int(key("context_length")), vocab_size=int(vocab),
            tied_embeddings="output.weight" not in tensors, has_qkv_bias=has_bias,
            has_qk_norm=family.qk_norm, rope_neox=family.rope_neox,
            embedding_scale=math.sqrt(n_embd) if family.embd_scale else 1.0,
            has_post_norms=family.post_norms, ffn_gelu=family.gelu, sliding_window=window,
            swa_layers=swa_layers,
            rope_base_swa=float(key("rope.freq_base_swa", family.rope_base_swa or key("rope.freq_base", 10000.0))),
            rope_freq_factors_swa=swa_factors, rope_yarn=yarn, rope_yarn_swa=family.swa_rope_scaled,
            attention_scale=(n_embd // n_head) ** -0.5 if n_layer in family.embd_per_head_scale_layers else None,
            ffn_norm="post_attention_norm" if family.oai else "ffn_norm",
            n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp,
            expert_weights_norm=family.expert_norm, expert_softmax_chosen=family.expert_softmax_chosen,
            ffn_oai=family.oai, has_attn_sinks=family.oai, has_attn_out_bias=family.oai)

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window (a local layer)."""
        return bool(self.swa_layers) and self.swa_layers[layer]

    def layer_rope_freq_factors(self, layer: int) -> tuple[float, ...] | None:
        return self.rope_freq_factors_swa if self.is_sliding(layer) else self.rope_freq_factors

    def layer_attention_scale(self, layer: int) -> float | None:
        """`layer`'s score scale: attention_scale times YaRN's mscale^2 where the layer has it."""
        scaled = self.rope_yarn is not None and (self.rope_yarn_swa or not self.is_sliding(layer))
        mscale = self.rope_yarn.mscale if scaled else 1.0
        if mscale == 1.0:
            return self.attention_scale
        return (self.head_dim ** -0.5 if self.attention_scale is None else self.attention_scale) * mscale * mscale

    def required_tensors(self) -> list[str]:
        per_layer = [*ATTENTION_TENSORS, self.ffn_norm, *(EXPERT_TENSORS if self.n_expert else DENSE_FFN_TENSORS)]
        if self.n_ff_shexp:
            per_layer += SHARED_EXPERT_TENSORS
        if self.ffn_oai:
            per_layer += [f"{t}.bias" for t in EXPERT_TENSORS]
        if self.has_attn_out_bias:
            per_layer.append("attn_output.bias")
        if self.has_attn_sinks:
            per_layer.append("attn_sinks")
        if self.has_qkv_bias:
            per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
        if self.has_qk_norm:
            per_layer += ["attn_q_norm", "attn_k_norm"]
        if self.has_post_norms:
            per_layer += ["post_attention_norm", "post_ffw_norm"]
        names = ["token_embd.weight", "output_norm.weight"]
        names += [f"blk.{i}.{t}" if t.endswith(".bias") else f"blk.{i}.{t}.weight"
                  for i in range(self.n_layer) for t in per_layer]
        return names

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape by its config's sizes (GGUF order: row length first) of each tensor the
        forward pass may read, by name (`output.weight` and the biases and norms of some
        families among them): check_tensors compares those a file holds."""
        q, kv, e = self.n_head * self.head_dim, self.n_head_kv * self.head_dim, self.n_embd
        whole = {"token_embd.weight": (e, self.vocab_size), "output.weight": (e, self.vocab_size),
                 "output_norm.weight": (e,)}
        layer = {"attn_norm.weight": (e,), "attn_q.weight": (e, q), "attn_k.weight": (e, kv),
                 "attn_v.weight": (e, kv), "attn_output.weight": (q, e), f"{self.ffn_norm}.weight": (e,),
                 "attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_output.bias": (e,),
                 "attn_q_norm.weight": (self.head_dim,), "attn_k_norm.weight": (self.head_dim,),
                 "post_attention_norm.weight": (e,), "post_ffw_norm.weight": (e,), "attn_sinks.weight": (self.n_head,)}
        if self.n_expert:
            layer |= {"ffn_gate_inp.weight": (e, self.n_expert),
                      "ffn_gate_exps.weight": (e, self.n_ff_exp, self.n_expert),
                      "ffn_up_exps.weight": (e, self.n_ff_exp, self.n_expert),
                      "ffn_down_exps.weight": (self.n_ff_exp, e, self.n_expert)}
        else:
            layer |= {"ffn_gate.weight": (e, self.n_ff), "ffn_up.weight": (e, self.n_ff), "ffn_down.weight": (self.n_ff, e)}
        if self.n_ff_shexp:   # the shared expert's gate is one row (llama.cpp: 1-D)
            layer |= {"ffn_gate_inp_shexp.weight": (e,), "ffn_gate_shexp.weight": (e, self.n_ff_shexp),
                      "ffn_up_shexp.weight": (e, self.n_ff_shexp), "ffn_down_shexp.weight": (self.n_ff_shexp, e)}
        return whole | {f"blk.{i}.{name}": shape for i in range(self.n_layer) for name, shape in layer.items()}

    def check_tensors(self, tensors: Mapping[str, Any]) -> None:
        """Raise GGUFError naming the first required tensor the file lacks, the first tensor
        the forward pass reads whose shape is not the config's (GGUF order; a trailing 1 is the
        same shape to ggml), or the first layer whose expert gate and up types differ (the fused
        kernel reads both alike)."""
        for name in self.required_tensors():
            if name not in tensors:
                raise GGUFError(f"required tensor '{name}' is missing ({self.arch} model)")
        for name, shape in self.tensor_shapes().items():
            info = tensors.get(name)
            if info is not None and tuple(info.shape) not in (shape, (*shape, 1)):
                raise GGUFError(f"tensor '{name}' has shape {tuple(info.shape)}, expected {shape} ({self.arch} model)")
        for i in range(self.n_layer if self.n_expert else 0):
            if tensors[f"blk.{i}.ffn_gate_exps.weight"].ggml_type != tensors[f"blk.{i}.ffn_up_exps.weight"].ggml_type:
                raise GGUFError(f"layer {i}: ffn_gate_exps and ffn_up_exps differ in type ({self.arch} model)")

    def describe(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _yarn(meta, arch) -> Yarn | None:
    if meta.get(f"{arch}.rope.scaling.type", "none") != "yarn":
        return None
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    original = int(meta.get(f"{arch}.rope.scaling.original_context_length", 0) or meta.get(f"{arch}.context_length", 0))
    if factor <= 0 or original <= 0:
        raise ValueError(f"yarn rope scaling with factor {factor} and original context {original}")
    ext = float(meta.get(f"{arch}.rope.scaling.yarn_ext_factor", -1.0))
    return Yarn(factor, original, float(meta.get(f"{arch}.rope.scaling.yarn_beta_fast", 32.0)),
                float(meta.get(f"{arch}.rope.scaling.yarn_beta_slow", 1.0)), 1.0 if ext < 0 else ext,
                float(meta.get(f"{arch}.rope.scaling.yarn_attn_factor", 1.0)))


def _rope_factors(meta, arch, tensors, head_dim, yarn_factors, tensor_only=False) -> tuple[float, ...] | None:
    """Per-pair angle divisors: the rope_freqs tensor's, times the scaling type's (unless
    tensor_only); None where all are 1."""
    freqs = tensors.get("rope_freqs.weight")
    scaled = None
    if freqs is not None:
        values = dequantize(freqs.data, freqs.ggml_type)
        scaled = tuple(float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1))
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    if tensor_only or kind == "none" or factor == 1.0 or (freqs is not None and kind == "linear"):
        return scaled
    if kind == "linear":
        return (factor,) * (head_dim // 2)
    if kind == "yarn":
        return yarn_factors if scaled is None else tuple(a * b for a, b in zip(scaled, yarn_factors))
    raise GGUFError(f"unsupported rope scaling type {kind!r}")


def _sliding_window(meta, arch, family, n_layer) -> tuple[int, tuple[bool, ...]]:
    """(window, per-layer local flags) as llama.cpp reads them; (0, ()) without a window."""
    window = int(meta.get(f"{arch}.attention.sliding_window", 0) or 0)
    if not family.swa_pattern or window <= 0:
        return 0, ()
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", family.swa_pattern)
    if isinstance(pattern, (list, tuple)):
        if len(pattern) != n_layer:
            raise ValueError(f"sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
        return window, tuple(bool(v) for v in pattern)
    pattern = int(pattern)
    return window, tuple(pattern == 0 or i % pattern < pattern - 1 for i in range(n_layer))

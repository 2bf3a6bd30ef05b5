"""A plain numpy forward pass over a GGUF file: the independent reference the GPU engine is
tested against. Float64 activations over weights dequantized by gguf.quants, written straight
from the maths (llama2.c's order of ops), sharing nothing with the engine but ModelFile.

Conventions follow llama.cpp: `llama` rotates adjacent pairs (x[2i], x[2i+1]), qwen2/qwen3
rotate halves (x[i], x[i + rope_dim/2]) ("NeoX"); rope_freqs divide the frequencies.
Gemma 3 as Hugging Face's Gemma3 text model computes it: embeddings times sqrt(hidden size),
RMSNorm also after attention and after the MLP (the file's norm weights already hold 1 + w),
gelu_pytorch_tanh gate, and local layers (all but every sixth) attending over the last
sliding_window positions with their own RoPE base (rope_local_base_freq) and no rope scaling.
Mixtures of experts as llama.cpp's build_moe_ffn: each token's router logits pick the
n_expert_used best experts; Qwen3-MoE weighs them by the softmax over all experts renormalised
over the chosen, gpt-oss by the softmax of the chosen logits; the weighted sum of the chosen
experts' SwiGLU FFNs. Qwen2-MoE weighs them by the softmax over all experts (not renormalised)
and adds a shared expert's SwiGLU FFN times sigmoid(ffn_gate_inp_shexp . h). gpt-oss besides: biases on the router and the experts, the clamped SwiGLU
(swiglu_oai: alpha 1.702, limit 7), an attention output bias and per-head sink logits in the
attention softmax's denominator, and every other layer local.
YaRN rope scaling as ggml's rope_yarn writes it (from the config's raw parameters, not its
folded factors): the interpolated and the original angle mixed by a ramp over the correction
dimensions, cos and sin times mscale; gpt-oss's local layers too.
"""
import math

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def yarn_angle(angle: np.ndarray, yarn, rope_dim: int, base: float) -> tuple[np.ndarray, float]:
    """ggml rope_yarn: (the angle mixed with its interpolation over pairs (last axis), mscale)."""
    def corr_dim(beta):
        return rope_dim * math.log(yarn.original_context / (beta * 2 * math.pi)) / (2 * math.log(base))
    low = max(0.0, math.floor(corr_dim(yarn.beta_fast)))
    high = min(rope_dim - 1.0, math.ceil(corr_dim(yarn.beta_slow)))
    freq_scale = 1.0 / yarn.factor
    ramp = 1 - np.clip((np.arange(angle.shape[-1]) - low) / max(0.001, high - low), 0, 1)
    mix = ramp * yarn.ext_factor
    mscale = yarn.attn_factor * (1 + 0.1 * math.log(1 / freq_scale)) if yarn.ext_factor else yarn.attn_factor
    return freq_scale * angle * (1 - mix) + angle * mix, mscale


def rope(x: np.ndarray, positions: np.ndarray, cfg, base=None, factors="config", yarn=None) -> np.ndarray:
    """x: (n_tokens, n_heads, head_dim) rotated over its first rope_dim dims; `base` and
    `factors` override the config's; `yarn`: YaRN parameters (models.config.Yarn) to apply."""
    half = cfg.rope_dim // 2
    base = cfg.rope_base if base is None else base
    factors = cfg.rope_freq_factors if factors == "config" else factors
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2 / cfg.rope_dim)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors[:half], dtype=np.float64)
    angle = positions[:, None, None] * inv_freq[None, None, :]
    mscale = 1.0
    if yarn is not None:
        angle, mscale = yarn_angle(angle, yarn, cfg.rope_dim, base)
    cos, sin = np.cos(angle) * mscale, np.sin(angle) * mscale
    out = x.copy()
    if cfg.rope_neox:
        a, b = x[..., :half], x[..., half:cfg.rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:cfg.rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:cfg.rope_dim:2], x[..., 1:cfg.rope_dim:2]
        out[..., 0:cfg.rope_dim:2] = a * cos - b * sin
        out[..., 1:cfg.rope_dim:2] = a * sin + b * cos
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int = 0, scale=None, sinks=None) -> np.ndarray:
    """Causal grouped-query attention of the last n positions. q: (n, n_head, d);
    k, v: (n_past + n, n_head_kv, d). window > 0: a query sees only the last `window` keys up to
    its own position. `scale` of the scores: 1/sqrt(d) unless given. `sinks` (n_head,): a logit
    per head that joins the softmax's denominator and attends to nothing."""
    n, n_head, d = q.shape
    group = n_head // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * (1 / np.sqrt(d) if scale is None else scale)
    key_pos, query_pos = np.arange(len(k))[None, :], np.arange(len(k) - n, len(k))[:, None]
    visible = key_pos <= query_pos
    if window:
        visible &= query_pos - key_pos < window
    scores = np.where(visible, scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks[:, None, None])
    scores = np.exp(scores - top)
    denominator = scores.sum(-1, keepdims=True)
    if sinks is not None:
        denominator = denominator + np.exp(sinks[:, None, None] - top)
    scores /= denominator
    return np.einsum("hqk,khd->qhd", scores, v)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    gate = np.minimum(gate, limit)
    return gate / (1 + np.exp(-alpha * gate)) * (np.clip(up, -limit, limit) + 1)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


class RefModel:
    """Dequantized weights are kept in `dtype` (float64 by default; float32 halves the memory,
    540 MB for SmolLM2-135M, and still agrees with float64 to ~1e-4 in the logits). `gelu` is
    the GeGLU gate's function (tests comparing with llama.cpp's CPU pass its f16-table form)."""

    def __init__(self, model_file, dtype=np.float64, gelu=gelu_tanh):
        self.mf = model_file
        self.cfg = model_file.config
        self.dtype = dtype
        self.gelu = gelu
        self.weights: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        if name not in self.weights:
            self.weights[name] = self.mf.dequantize(name).astype(self.dtype)
        return self.weights[name]

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w(f"{name}.weight").T
        return y + self.w(f"{name}.bias") if f"{name}.bias" in self.mf.tensors else y

    def block(self, x: np.ndarray, i: int, positions: np.ndarray, cache: list) -> np.ndarray:
        c, p = self.cfg, f"blk.{i}"
        h = rms_norm(x, self.w(f"{p}.attn_norm.weight"), c.norm_eps)
        q = self.linear(h, f"{p}.attn_q").reshape(len(x), c.n_head, c.head_dim)
        k = self.linear(h, f"{p}.attn_k").reshape(len(x), c.n_head_kv, c.head_dim)
        v = self.linear(h, f"{p}.attn_v").reshape(len(x), c.n_head_kv, c.head_dim)
        if c.has_qk_norm:
            q = rms_norm(q, self.w(f"{p}.attn_q_norm.weight"), c.norm_eps)
            k = rms_norm(k, self.w(f"{p}.attn_k_norm.weight"), c.norm_eps)
        local = bool(c.swa_layers) and c.swa_layers[i]
        tensor = tuple(self.w("rope_freqs.weight")) if "rope_freqs.weight" in self.mf.tensors else None
        yarn = c.rope_yarn if c.rope_yarn and (c.rope_yarn_swa or not local) else None
        if local:   # a local layer: its own base, no linear scaling (a rope_freqs tensor stays)
            base, factors = c.rope_base_swa, tensor
        else:       # YaRN's factors are applied by rope_yarn, not taken from the config
            base, factors = c.rope_base, tensor if c.rope_yarn else c.rope_freq_factors
        q, k = rope(q, positions, c, base, factors, yarn), rope(k, positions, c, base, factors, yarn)
        if len(cache) > i:
            k, v = np.concatenate([cache[i][0], k]), np.concatenate([cache[i][1], v])
            cache[i] = (k, v)
        else:
            cache.append((k, v))
        sinks = self.w(f"{p}.attn_sinks.weight") if c.has_attn_sinks else None
        att = self.linear(attention(q, k, v, c.sliding_window if local else 0, c.attention_scale, sinks)
                          .reshape(len(x), -1), f"{p}.attn_output")
        if c.has_post_norms:
            att = rms_norm(att, self.w(f"{p}.post_attention_norm.weight"), c.norm_eps)
        x = x + att
        h = rms_norm(x, self.w(f"{p}.{c.ffn_norm}.weight"), c.norm_eps)
        if c.n_expert:
            return x + self.moe(h, p)
        act = self.gelu if c.ffn_gelu else silu
        ffn = self.linear(act(self.linear(h, f"{p}.ffn_gate")) * self.linear(h, f"{p}.ffn_up"), f"{p}.ffn_down")
        if c.has_post_norms:
            ffn = rms_norm(ffn, self.w(f"{p}.post_ffw_norm.weight"), c.norm_eps)
        return x + ffn

    def moe(self, h: np.ndarray, p: str) -> np.ndarray:
        """The mixture-of-experts FFN of block `p` on normalised inputs h (n, n_embd)."""
        c = self.cfg
        logits = self.linear(h, f"{p}.ffn_gate_inp")
        out = np.zeros_like(h)
        for t in range(len(h)):
            chosen = np.argsort(-logits[t], kind="stable")[:c.n_expert_used]
            if c.expert_softmax_chosen:
                w = np.exp(logits[t, chosen] - logits[t, chosen].max())
                w /= w.sum()
            else:
                w = np.exp(logits[t] - logits[t].max())
                w = (w / w.sum())[chosen]
            if c.expert_weights_norm:
                w = w / max(w.sum(), 6.103515625e-5)
            for weight, e in zip(w, chosen):
                out[t] += weight * self.expert(h[t], p, e)
        if c.n_ff_shexp:
            gate = h @ self.w(f"{p}.ffn_gate_inp_shexp.weight").reshape(-1)
            shared = self.linear(silu(self.linear(h, f"{p}.ffn_gate_shexp")) * self.linear(h, f"{p}.ffn_up_shexp"),
                                 f"{p}.ffn_down_shexp")
            out += shared / (1 + np.exp(-gate))[:, None]
        return out

    def expert(self, h: np.ndarray, p: str, e: int) -> np.ndarray:
        """Expert e's FFN of block p on one normalised input h (n_embd,)."""
        def product(name, v):
            y = self.w(f"{p}.{name}.weight")[e] @ v
            return y + self.w(f"{p}.{name}.bias")[e] if self.cfg.ffn_oai else y
        gate, up = product("ffn_gate_exps", h), product("ffn_up_exps", h)
        return product("ffn_down_exps", swiglu_oai(gate, up) if self.cfg.ffn_oai else silu(gate) * up)

    def logits(self, token_ids, cache: list | None = None) -> np.ndarray:
        """Logits of token_ids following the positions already in `cache` (a list of per-layer
        (k, v), extended in place); a fresh cache when None."""
        cache = [] if cache is None else cache
        tokens = np.asarray(token_ids, dtype=np.int64)
        start = len(cache[0][0]) if cache else 0
        positions = np.arange(start, start + len(tokens), dtype=np.float64)   # RoPE in float64
        x = self.w("token_embd.weight")[tokens]
        if self.cfg.embedding_scale != 1.0:
            x = x * np.sqrt(self.cfg.n_embd)
        for i in range(self.cfg.n_layer):
            x = self.block(x, i, positions, cache)
        x = rms_norm(x, self.w("output_norm.weight"), self.cfg.norm_eps)
        out = "token_embd" if self.cfg.tied_embeddings else "output"
        return x @ self.w(f"{out}.weight").T

    def greedy(self, token_ids, n: int) -> list[int]:
        """n greedily chosen tokens after token_ids."""
        cache: list = []
        logits = self.logits(token_ids, cache)
        out = []
        for _ in range(n):
            out.append(int(logits[-1].argmax()))
            logits = self.logits([out[-1]], cache)
        return out


def logits(model_file, token_ids, dtype=np.float64) -> np.ndarray:
    """(n_tokens, vocab) logits of every position."""
    return RefModel(model_file, dtype).logits(token_ids)

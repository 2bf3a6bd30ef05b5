"""A plain numpy forward pass over a GGUF file: the independent reference the GPU engine is
tested against. Float64 activations over weights dequantized by gguf.quants, written straight
from the maths (llama2.c's order of ops), sharing nothing with the engine but ModelFile.

Conventions follow llama.cpp: `llama` rotates adjacent pairs (x[2i], x[2i+1]), qwen2/qwen3
rotate halves (x[i], x[i + rope_dim/2]) ("NeoX"); rope_freqs divide the frequencies.
"""
import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x: np.ndarray, positions: np.ndarray, cfg) -> np.ndarray:
    """x: (n_tokens, n_heads, head_dim) rotated over its first rope_dim dims."""
    half = cfg.rope_dim // 2
    inv_freq = cfg.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / cfg.rope_dim)
    if cfg.rope_freq_factors is not None:
        inv_freq = inv_freq / np.asarray(cfg.rope_freq_factors[:half], dtype=np.float64)
    angle = positions[:, None, None] * inv_freq[None, None, :]
    cos, sin = np.cos(angle), np.sin(angle)
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


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal grouped-query attention. q: (n, n_head, d); k, v: (n, n_head_kv, d)."""
    n, n_head, d = q.shape
    group = n_head // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", scores, v)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1 + np.exp(-x))


class RefModel:
    """Dequantized weights are kept as float32 (540 MB for SmolLM2-135M) and widened per op."""

    def __init__(self, model_file):
        self.mf = model_file
        self.cfg = model_file.config
        self.weights: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        if name not in self.weights:
            self.weights[name] = self.mf.dequantize(name)
        return self.weights[name].astype(np.float64)

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.w(f"{name}.weight").T
        return y + self.w(f"{name}.bias") if f"{name}.bias" in self.mf.tensors else y

    def block(self, x: np.ndarray, i: int, positions: np.ndarray) -> np.ndarray:
        c, p = self.cfg, f"blk.{i}"
        h = rms_norm(x, self.w(f"{p}.attn_norm.weight"), c.norm_eps)
        q = self.linear(h, f"{p}.attn_q").reshape(len(x), c.n_head, c.head_dim)
        k = self.linear(h, f"{p}.attn_k").reshape(len(x), c.n_head_kv, c.head_dim)
        v = self.linear(h, f"{p}.attn_v").reshape(len(x), c.n_head_kv, c.head_dim)
        if c.has_qk_norm:
            q = rms_norm(q, self.w(f"{p}.attn_q_norm.weight"), c.norm_eps)
            k = rms_norm(k, self.w(f"{p}.attn_k_norm.weight"), c.norm_eps)
        q, k = rope(q, positions, c), rope(k, positions, c)
        x = x + self.linear(attention(q, k, v).reshape(len(x), -1), f"{p}.attn_output")
        h = rms_norm(x, self.w(f"{p}.ffn_norm.weight"), c.norm_eps)
        ffn = silu(self.linear(h, f"{p}.ffn_gate")) * self.linear(h, f"{p}.ffn_up")
        return x + self.linear(ffn, f"{p}.ffn_down")

    def logits(self, token_ids) -> np.ndarray:
        tokens = np.asarray(token_ids, dtype=np.int64)
        positions = np.arange(len(tokens), dtype=np.float64)
        x = self.w("token_embd.weight")[tokens]
        for i in range(self.cfg.n_layer):
            x = self.block(x, i, positions)
        x = rms_norm(x, self.w("output_norm.weight"), self.cfg.norm_eps)
        out = "token_embd" if self.cfg.tied_embeddings else "output"
        return x @ self.w(f"{out}.weight").T


    def greedy(self, token_ids, n: int) -> list[int]:
        """n greedily chosen tokens after token_ids (recomputing the whole sequence each step)."""
        tokens = list(token_ids)
        for _ in range(n):
            tokens.append(int(self.logits(tokens)[-1].argmax()))
        return tokens[len(token_ids):]


def logits(model_file, token_ids) -> np.ndarray:
    """(n_tokens, vocab) logits of every position, float64."""
    return RefModel(model_file).logits(token_ids)

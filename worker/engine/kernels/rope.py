"""Rotary position embedding fused with the append to the paged KV cache (rope_store_kv.comp,
rope.glsl). Each token's sequence slot and position come from the step buffer, so a recorded
command buffer replays for every step."""
import math

from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import threads
from worker.engine.kernels.paged import PagedCache
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def rope_store_kv(rec: Recording, shape: AttentionShape, q: Buffer, k: Buffer, v: Buffer, cache: PagedCache,
                  step: Buffer, n_tokens: int, freq_factors: Buffer | None = None,
                  qk_norm: tuple[Buffer, Buffer, float] | None = None,
                  bias: tuple[Buffer, Buffer, Buffer] | None = None):
    """RoPE on q and k and the KV-cache append in one dispatch: q f32 [n_tokens, n_head, head_dim]
    rotated in place; k rotated and v as is, both f32 [n_tokens, n_head_kv * head_dim], written
    (f16, or 8-bit with the cache's scales) to the cache row of position step[2t + 1] of the
    sequence in slot step[2t] (through cache.table); k itself is not updated. llama.cpp
    semantics: token t sits at position step[2t + 1]; normal rotates pairs
    (2i, 2i+1), NeoX (i, i + rope_dim/2), with theta = pos * base^(-2i/rope_dim) / freq_factors[i];
    dimensions past rope_dim are left alone. `bias` (the q, k and v projections' biases, f32
    [n_head * head_dim] and [n_head_kv * head_dim] twice): added to q, k and v first (Qwen2,
    gpt-oss; q keeps them). `qk_norm` (q weight, k weight, eps; f32 [head_dim] each): every q
    and k head is then x / sqrt(mean(x^2) + eps) * weight over its head_dim (Qwen3's and Gemma
    3's norms before RoPE), q in place. One workgroup per head (q, k, then v) and token, its size
    about half a head's width in whole subgroups."""
    ctx = rec.ctx
    sub = ctx.info.subgroup_size
    size = min(threads(ctx), max(sub, cdiv(shape.head_dim // 2, sub) * sub))
    spec = {0: size, 1: int(shape.rope_neox), 5: cache.block}
    name, ff = ("rope_store_kv", []) if freq_factors is None else ("rope_store_kv_freq_factors", [freq_factors])
    push = dict(n_head=shape.n_head, n_head_kv=shape.n_head_kv, head_dim=shape.head_dim, rope_dim=shape.rope_dim,
                log2_base=math.log2(shape.rope_base), table_stride=cache.table_stride)
    norms, biases = [], list(bias or ())
    if bias is not None:
        name += "_bias"
    if qk_norm is not None:
        *norms, eps = qk_norm
        name, push["eps"] = name + "_qk_norm", float(eps)
    rec.dispatch(ctx.kernel(name + cache.suffix, spec),
                 [q, k, v, cache.k, cache.v, step, cache.table, *ff, *cache.scales, *norms, *biases],
                 (shape.n_head + 2 * shape.n_head_kv, n_tokens, 1), push)

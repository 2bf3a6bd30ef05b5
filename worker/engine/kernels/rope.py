"""Rotary position embedding fused with the KV-cache append (rope_store_kv.comp, rope.glsl).
Positions come from the step buffer, so a recorded command buffer replays for every token."""
import math

from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import threads
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def rope_store_kv(rec: Recording, shape: AttentionShape, q: Buffer, k: Buffer, v: Buffer, k_cache: Buffer,
                  v_cache: Buffer, step: Buffer, n_tokens: int, freq_factors: Buffer | None = None):
    """RoPE on q and k and the KV-cache append in one dispatch: q f32 [n_tokens, n_head, head_dim]
    rotated in place; k rotated and v as is, both f32 [n_tokens, n_head_kv * head_dim], written as
    f16 to rows step[0] + t of k_cache and v_cache [n_ctx, n_head_kv * head_dim]; k itself is not
    updated. llama.cpp semantics: token t sits at position step[0] + t; normal rotates pairs
    (2i, 2i+1), NeoX (i, i + rope_dim/2), with theta = pos * base^(-2i/rope_dim) / freq_factors[i];
    dimensions past rope_dim are left alone. One workgroup per head (q, k, then v) and token, its
    size about half a head's width in whole subgroups."""
    ctx = rec.ctx
    sub = ctx.info.subgroup_size
    size = min(threads(ctx), max(sub, cdiv(shape.head_dim // 2, sub) * sub))
    spec = {0: size, 1: int(shape.rope_neox)}
    name, ff = ("rope_store_kv", []) if freq_factors is None else ("rope_store_kv_freq_factors", [freq_factors])
    push = dict(n_head=shape.n_head, n_head_kv=shape.n_head_kv, head_dim=shape.head_dim, rope_dim=shape.rope_dim,
                log2_base=math.log2(shape.rope_base))
    rec.dispatch(ctx.kernel(name, spec), [q, k, v, k_cache, v_cache, step, *ff],
                 (shape.n_head + 2 * shape.n_head_kv, n_tokens, 1), push)

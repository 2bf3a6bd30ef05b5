"""Rotary position embedding (rope.comp), alone or fused with the KV-cache append
(rope_store_kv.comp); both share rope.glsl, so they give the same bits. Positions come from the
step buffer, so a recorded command buffer replays for every token."""
import math

from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.vk.commands import Recording, pack_push
from worker.engine.vk.memory import Buffer


def rope(rec: Recording, x: Buffer, step: Buffer, n_tokens: int, n_heads: int, head_dim: int, rope_dim: int,
         base: float, neox: bool, freq_factors: Buffer | None = None):
    """In place on x f32 [n_tokens, n_heads, head_dim]; token t sits at position step[0] + t.
    llama.cpp semantics: normal rotates pairs (2i, 2i+1), NeoX (i, i + rope_dim/2), with
    theta = pos * base^(-2i/rope_dim) / freq_factors[i]; dimensions past rope_dim are left alone."""
    assert rope_dim % 2 == 0 and rope_dim <= head_dim
    size = threads(rec.ctx)
    pairs = n_tokens * n_heads * rope_dim // 2
    spec = {0: size, 1: int(neox)}
    name, buffers = ("rope", [x, step]) if freq_factors is None else ("rope_freq_factors", [x, step, freq_factors])
    push = pack_push(n_tokens, n_heads, head_dim, rope_dim, math.log2(base))
    rec.dispatch(rec.ctx.kernel(name, spec), buffers, (stride_groups(rec.ctx, pairs, size), 1, 1), push)



def rope_store_kv(rec: Recording, q: Buffer, k: Buffer, v: Buffer, k_cache: Buffer, v_cache: Buffer, step: Buffer,
                  n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, rope_dim: int, base: float, neox: bool,
                  freq_factors: Buffer | None = None):
    """One dispatch for what rope(q), rope(k), kv_store(k), kv_store(v) do with a barrier between:
    q f32 [n_tokens, n_head, head_dim] rotated in place; k rotated and v as is, both f32
    [n_tokens, n_head_kv * head_dim], written as f16 to rows step[0] + t of k_cache and v_cache
    [n_ctx, n_head_kv * head_dim]; k itself is not updated. One workgroup per head (q, k, then v)
    and token, its size about half a head's width in whole subgroups."""
    assert rope_dim % 2 == 0 and rope_dim <= head_dim
    ctx = rec.ctx
    sub = ctx.info.subgroup_size
    size = min(threads(ctx), max(sub, -(-(head_dim // 2) // sub) * sub))
    spec = {0: size, 1: int(neox)}
    name, ff = ("rope_store_kv", []) if freq_factors is None else ("rope_store_kv_freq_factors", [freq_factors])
    push = pack_push(n_head, n_head_kv, head_dim, rope_dim, math.log2(base))
    rec.dispatch(ctx.kernel(name, spec), [q, k, v, k_cache, v_cache, step, *ff], (n_head + 2 * n_head_kv, n_tokens, 1),
                 push)

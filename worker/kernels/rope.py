"""Rotary position embedding (rope.comp). Positions come from the step buffer, so a recorded
command buffer replays for every token."""
import math

from worker.kernels.launch import stride_groups, threads
from worker.vk.commands import Recording, pack_push
from worker.vk.memory import Buffer


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


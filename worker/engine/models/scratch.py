"""Activation and kernel scratch buffers for forward passes of up to n tokens, allocated once
per model."""
from dataclasses import dataclass, fields

from worker.engine.kernels import attention, select
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.vk.memory import Buffer


@dataclass(eq=False)
class Scratch:
    ids: Buffer      # uint32 [n] token ids (host-visible: the host writes them)
    x: Buffer        # f32 [n, n_embd] residual stream
    xb: Buffer       # f32 [n, n_embd] normalised input of a block
    q: Buffer        # f32 [n, n_head * head_dim]
    k: Buffer        # f32 [n, n_head_kv * head_dim]
    v: Buffer
    att: Buffer      # f32 [n, n_head * head_dim] attention output
    gate: Buffer     # f32 [n, n_ff]
    up: Buffer
    attention: Buffer | None   # split attention's partials (None: attention never splits)
    select: Buffer             # argmax's and top-k's survivors over the logits

    def __init__(self, ctx, c, n: int, shape: AttentionShape):
        q_width, kv_width = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.ids = ctx.alloc_host(4 * n)
        for name, width in (("x", c.n_embd), ("xb", c.n_embd), ("q", q_width), ("k", kv_width),
                            ("v", kv_width), ("att", q_width), ("gate", c.n_ff), ("up", c.n_ff)):
            setattr(self, name, ctx.alloc(4 * n * width))
        split_bytes = attention.split_scratch_bytes(shape, n)
        self.attention = ctx.alloc(split_bytes) if split_bytes else None
        vocab = c.vocab_size
        self.select = ctx.alloc(max(select.scratch_bytes(ctx, 1, vocab, 1),
                                    select.scratch_bytes(ctx, 1, vocab, min(select.MAX_K, vocab))))
        self.n = n

    def free(self, ctx):
        for f in fields(self):
            if getattr(self, f.name) is not None:
                ctx.free(getattr(self, f.name))

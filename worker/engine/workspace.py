"""Every buffer a recorded forward pass writes besides the KV cache: the per-replay inputs the host
fills (step values, token ids, the rows that get logits), the activations, the kernels' own
scratch (split attention's partials and counters, top-k's survivors) and what the sampler reads back. Allocated
once by the Runner that owns it, for passes of up to `n` tokens with logits for up to `sequences`
rows (one per sequence of a batched pass); the memory plan counts the same sizes (`sizes` and
`kernel_sizes`), so what is planned is what is allocated. This module loads no Vulkan until a
device is at hand: the plan of `vkllm models inspect` needs none."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from worker.engine.intmath import cdiv
from worker.engine.kernels.shapes import MAX_K

if TYPE_CHECKING:
    from worker.engine.vk.memory import Buffer


@dataclass(eq=False)
class Workspace:
    step: Buffer        # uint32 [n, 2]: each token's (sequence slot, position), host-written per replay
    ids: Buffer         # uint32 [n] token ids, host-written per replay
    rows: Buffer        # uint32 [sequences]: the tokens whose logits a batched pass computes
    x: Buffer           # f32 [n, n_embd] residual stream
    xb: Buffer          # f32 [n, n_embd] normalised input of a block
    q: Buffer           # f32 [n, n_head * head_dim]
    k: Buffer           # f32 [n, n_head_kv * head_dim]
    v: Buffer
    att: Buffer         # f32 [n, n_head * head_dim] attention output
    gate: Buffer        # f32 [n, n_ff], or [n, n_ff_shexp] for a shared expert (None: neither)
    up: Buffer
    # A mixture-of-experts FFN's (None in a dense model), per slot = (token, chosen expert):
    moe_logits: Buffer | None   # f32 [n, n_expert] router logits
    moe_ids: Buffer | None      # uint32 [n * n_expert_used] chosen experts
    moe_weights: Buffer | None  # f32 [n * n_expert_used] their weights
    moe_gate: Buffer | None     # f32 [n * n_expert_used, n_ff_exp] the experts' SwiGLU
    moe_out: Buffer | None      # f32 [n * n_expert_used, n_embd] their down products
    moe_tiles: Buffer | None    # the slots grouped by expert (kernels/experts.py's group), prefill only
    moe_up: Buffer | None       # f32 [n * n_expert_used, n_ff_exp] the up products of the mat-mat expert path
    moe_shared_gate: Buffer | None  # f32 [n]: the shared expert's gate logit per token (None: no shared expert)
    logits: Buffer      # f32 [sequences, vocab], read back when the sampler needs them all
    batch_logits: Buffer   # f32 [sequences, vocab] in device memory: a batched pass's rows (Runner)
    best: Buffer        # uint32 [sequences]: GPU argmax per row
    top_ids: Buffer     # uint32 [sequences, MAX_K]: GPU top-k candidates per row
    top_values: Buffer  # f32 [sequences, MAX_K]
    # Greedy decode and fed batch passes keep two steps in flight (Runner.greedy, queue_fed_batch):
    # the second step's values (uint32 [sequences, 2]) and argmax (uint32 [sequences]).
    step_alt: Buffer
    best_alt: Buffer
    mask: Buffer        # uint32 [sequences, vocab / 32]: grammars' token masks, host-written per step (kernels/mask.py)
    attention: Buffer | None   # split attention's partials (None: attention never splits)
    attention_tiles: Buffer | None  # uint32: a pass's tiles for the tiled attention kernel, host-written per
                                    # replay (attention.write_tiles; None: no pass takes that kernel)
    select: Buffer             # argmax's and top-k's survivors over the logits
    x8: Buffer | None          # the mmq products' 8-bit activations (None: the device's prefill takes other kernels)
    x8_ffn: Buffer | None      # the gate+up output in 8-bit blocks, one column (matmul's BlocksOut;
                               # None: the device decodes over f32 x, or the FFN is a mixture of experts)
    x8_norm: Buffer | None     # the next RMSNorm's input in 8-bit blocks, one column, unscaled (matmul's
                               # NormBlocks; None: the device decodes over f32 x)
    xh: Buffer | None          # the cooperative-matrix products' f16 activations (kernels/halves.py; None:
                               # the device has no such kernel, or passes take at most the mat-vec columns)
    done: Buffer               # uint32 counters of the products whose last workgroups write blocks (matmul's
                               # BlocksOut and NormBlocks, one per block): zeroed when allocated, left at 0 by them
    # A model split across contexts (worker/engine/placement.py): f32 [n, n_embd], the hidden
    # state a stage hands to the next (None with one context). It, best and best_alt lie in host
    # memory every stage's context imports (SHARED, vk/linked.py): what one stage writes there
    # the next reads, the first stage's greedy token included.
    handoff: Buffer | None

    # What the host writes for a pass (kernels read it: ctx.alloc_input, device memory the host maps
    # where there is such, so that the attention kernels' first load of a layer is no bus round
    # trip) and what it reads back (host memory: reads of device memory over the bus are slow).
    HOST_WRITTEN = frozenset({"step", "ids", "rows", "step_alt", "mask", "attention_tiles"})
    HOST_READ = frozenset({"logits", "best", "top_ids", "top_values", "best_alt", "handoff"})
    SHARED = ("handoff", "best", "best_alt")

    @staticmethod
    def sizes(config, n: int, sequences: int = 1, staged: bool = False) -> dict[str, int]:
        """Bytes of each buffer for passes of up to n tokens of a model of `config`, with logits
        for up to `sequences` rows; `staged`: the model is split across contexts (each stage
        has a workspace of these sizes)."""
        c = config
        q_width, kv_width = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        slots = c.n_expert_used
        ff = c.n_ff_shexp if c.n_expert else c.n_ff   # the dense FFN's or the shared expert's
        rows = {"x": c.n_embd, "xb": c.n_embd, "q": q_width, "k": kv_width, "v": kv_width,
                "att": q_width, "gate": ff, "up": ff, "moe_logits": c.n_expert,
                "moe_ids": slots, "moe_weights": slots, "moe_gate": slots * c.n_ff_exp, "moe_out": slots * c.n_embd,
                "moe_shared_gate": 1 if c.n_ff_shexp else 0}
        s = sequences
        return {"step": 8 * n, "ids": 4 * n, "rows": 4 * s, **{name: 4 * n * width for name, width in rows.items()},
                "logits": 4 * c.vocab_size * s, "batch_logits": 4 * c.vocab_size * s, "best": 4 * s,
                "top_ids": 4 * MAX_K * s, "top_values": 4 * MAX_K * s, "step_alt": 8 * s, "best_alt": 4 * s,
                "mask": 4 * cdiv(c.vocab_size, 32) * s, "handoff": 4 * n * c.n_embd if staged else 0,
                "done": 4 * cdiv(max(ff, c.n_embd), 32)}

    @staticmethod
    def kernel_sizes(ctx, config, n: int, shape, sequences: int = 1) -> dict[str, int]:
        """Bytes of the kernels' scratch for passes of up to n tokens over `shape` (an
        AttentionShape) with up to `sequences` logits rows, on the device of `ctx` (top-k's
        stages depend on its workgroup size, an expert tile's slots on its shared memory)."""
        from worker.engine.kernels import attention, experts, select
        from worker.engine.kernels.halves import f16_bytes
        from worker.engine.kernels.x8 import x8_bytes
        from worker.engine.kernels.paths import (MAT_COLS_X8_MAX, MAT_VEC_MAX_COLS, decode_x8, mat_mat_path,
                                                 may_take_mat_mat, paths)
        vocab, c = config.vocab_size, config
        slots = n * c.n_expert_used
        expert_path = experts.path(ctx, n) if c.n_expert else "mat_vec"
        mat_mat = may_take_mat_mat(ctx, n)
        mmq = mat_mat and "mmq" in (mat_mat_path(ctx), expert_path)
        # decode's 8-bit mat-vec groups (up to 8 columns) and mat-cols products (up to 64)
        x8_rows = n if mmq else min(n, MAT_COLS_X8_MAX) if decode_x8(ctx) else 0
        product_k = max(c.n_embd, c.n_ff, c.n_ff_shexp, c.n_head * c.head_dim)   # the longest input of a product
        return {"attention": attention.split_scratch_bytes(shape, n),
                "attention_tiles": attention.tiles_bytes(ctx, n, sequences),
                "select": max(select.scratch_bytes(ctx, sequences, vocab, 1),
                              select.scratch_bytes(ctx, sequences, vocab, min(MAX_K, vocab))),
                "moe_tiles": experts.tiles_bytes(slots, c.n_expert, experts.group_cols(ctx, expert_path))
                if expert_path != "mat_vec" else 0,
                "moe_up": 4 * slots * c.n_ff_exp if expert_path in experts.MAT_MAT_PATHS else 0,
                # the products' inputs per token, and in decode the expert down products' per slot
                # (models/moe.py; in prefill those take f32 input)
                "x8": max(x8_bytes(x8_rows, product_k),
                          x8_bytes(min(n, MAT_VEC_MAX_COLS) * c.n_expert_used, c.n_ff_exp) if decode_x8(ctx) else 0),
                "x8_ffn": x8_bytes(1, c.n_ff) if decode_x8(ctx) and not c.n_expert else 0,
                "x8_norm": x8_bytes(1, c.n_embd) if decode_x8(ctx) else 0,
                "xh": f16_bytes(n, product_k) if mat_mat and "coopmat" in paths(ctx) else 0}

    @classmethod
    def allocate(cls, ctx, config, n: int, shape, sequences: int = 1, shared: dict[str, Buffer] | None = None
                 ) -> Workspace:
        """`shared`: the SHARED buffers of a stage of a split model, allocated by the caller
        (the workspace is then sized for a stage, with its `handoff`)."""
        shared = shared or {}
        sizes = cls.sizes(config, n, sequences, bool(shared)) | cls.kernel_sizes(ctx, config, n, shape, sequences)
        def alloc(name):
            if name in cls.HOST_WRITTEN:
                return ctx.alloc_input
            return ctx.alloc_host if name in cls.HOST_READ else ctx.alloc

        buffers = {name: shared.get(name) or (alloc(name)(nbytes) if nbytes else None)
                   for name, nbytes in sizes.items()}
        workspace = cls(**buffers)
        workspace.n, workspace.sequences, workspace.shared = n, sequences, set(shared)
        for counted in (workspace.attention, workspace.done):   # counters start at 0 (and are left so)
            if counted is not None:
                ctx.upload(counted, np.zeros(counted.size, np.uint8))
        return workspace

    def free(self, ctx):
        """Frees what `allocate` allocated (the shared buffers are the caller's)."""
        for f in fields(self):
            if getattr(self, f.name) is not None and f.name not in self.shared:
                ctx.free(getattr(self, f.name))

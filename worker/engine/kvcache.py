"""The paged KV cache of one model on the device: for every layer a K pool and a V pool of
n_blocks blocks (f16, or q8_0-like 8-bit values with their f16 scales), the block table the
kernels read (uint32 [slots, blocks per sequence], host-visible), the sequence slots, and the
BlockPool (kvblocks.py) that says which blocks are free, held or cached for prefix reuse."""
import numpy as np

from worker.engine.intmath import cdiv
from worker.engine.kernels.paged import KV_TYPES, Q8_GROUP, PagedCache, row_bytes
from worker.engine.kvblocks import BLOCK_TOKENS, BlockPool, SequenceBlocks


def block_bytes(config, kv_type: str) -> int:
    """Device bytes of one block across all layers, K and V."""
    return 2 * config.n_layer * BLOCK_TOKENS * row_bytes(kv_type, config.n_head_kv * config.head_dim)


class KVCache:
    def __init__(self, ctx, config, n_ctx: int, n_blocks: int, n_slots: int, kv_type: str = "f16"):
        if kv_type not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {kv_type!r}")
        width = config.n_head_kv * config.head_dim
        if kv_type == "q8_0" and config.head_dim % Q8_GROUP:
            raise ValueError(f"an 8-bit KV cache needs head_dim a multiple of {Q8_GROUP}, not {config.head_dim}")
        self.ctx, self.kv_type, self.n_slots = ctx, kv_type, n_slots
        self.stride = cdiv(n_ctx, BLOCK_TOKENS)
        self.table = ctx.alloc_host(4 * n_slots * self.stride)
        self._table = self.table.view(np.uint32)[:n_slots * self.stride].reshape(n_slots, self.stride)
        self._table[:] = 0
        rows = n_blocks * BLOCK_TOKENS
        self._buffers = []

        def alloc(nbytes):
            self._buffers.append(ctx.alloc(nbytes))
            return self._buffers[-1]

        self.layers = []
        for _ in range(config.n_layer):
            if kv_type == "f16":
                self.layers.append(PagedCache(alloc(2 * rows * width), alloc(2 * rows * width), self.table,
                                              BLOCK_TOKENS, self.stride))
            else:
                scales = 2 * rows * width // Q8_GROUP
                self.layers.append(PagedCache(alloc(rows * width), alloc(rows * width), self.table, BLOCK_TOKENS,
                                              self.stride, alloc(scales), alloc(scales)))
        self.pool = BlockPool(n_blocks)
        self._free_slots = list(range(n_slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def take_slot(self) -> int | None:
        return self._free_slots.pop() if self._free_slots else None

    def give_slot(self, slot: int):
        self._free_slots.append(slot)

    def sequence(self) -> SequenceBlocks:
        return SequenceBlocks(self.pool)

    def write_table(self, slot: int, blocks: SequenceBlocks):
        """The slot's row of the block table: what the next pass reads for that sequence."""
        self._table[slot, :len(blocks.blocks)] = blocks.blocks

    def stats(self) -> dict:
        return {"kv_blocks_used": self.pool.used, "kv_blocks_total": self.pool.n_blocks,
                "kv_blocks_cached": self.pool.cached, "prefix_hit_tokens": self.pool.hit_tokens}

    def free(self):
        for buffer in [*self._buffers, self.table]:
            self.ctx.free(buffer)
        self._buffers = []

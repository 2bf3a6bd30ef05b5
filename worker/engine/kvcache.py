"""The paged KV cache of one model on the device: for every layer a K pool and a V pool of
n_blocks blocks (f16, or q8_0-like 8-bit values with their f16 scales), the block table the
kernels read (uint32 [slots, blocks per sequence], written by the host before each pass), the
sequence slots, and the BlockPool (kvblocks.py) that says which blocks are free, held or cached
for prefix reuse. Split across contexts (worker/engine/placement.py), each layer's pools are on
its stage's context, with a copy of the table there; the BlockPool and the slots are shared."""
import numpy as np

from vkllm.errors import VkllmError
from worker.engine.intmath import cdiv
from worker.engine.kernels.paged import KV_TYPES, Q8_GROUP, PagedCache, row_bytes
from worker.engine.kvblocks import BLOCK_TOKENS, BlockPool, SequenceBlocks


def block_bytes(config, kv_type: str, n_layers: int | None = None) -> int:
    """Device bytes of one block across all layers (or n_layers of them), K and V."""
    layers = config.n_layer if n_layers is None else n_layers
    return 2 * layers * BLOCK_TOKENS * row_bytes(kv_type, config.n_head_kv * config.head_dim)


class KVCache:
    def __init__(self, placement, config, n_ctx: int, n_blocks: int, n_slots: int, kv_type: str = "f16"):
        """`placement`: the Stages (worker/engine/placement.py) whose contexts hold their layers'
        pools; each has its own copy of the block table, written together. Every stage's pools
        have the same n_blocks: a block id names the same positions in every layer."""
        if kv_type not in KV_TYPES:
            raise VkllmError(f"unknown KV cache type {kv_type!r}")
        width = config.n_head_kv * config.head_dim
        if kv_type == "q8_0" and config.head_dim % Q8_GROUP:
            raise VkllmError(f"an 8-bit KV cache (VKLLM_KV_TYPE=q8_0) needs heads of a multiple of {Q8_GROUP} "
                             f"values; this model's have {config.head_dim}")
        self.kv_type, self.n_slots = kv_type, n_slots
        self.stride = cdiv(n_ctx, BLOCK_TOKENS)
        rows = n_blocks * BLOCK_TOKENS
        self._buffers = []   # the K/V pools' buffers
        self._owned = []     # (context, buffer) of those and of the tables
        self._tables = []    # each stage's table, uint32 [n_slots, stride] views
        self.layers = []
        for stage in placement:
            ctx = stage.ctx

            def alloc(nbytes, ctx=ctx):
                self._buffers.append(ctx.alloc(nbytes))
                self._owned.append((ctx, self._buffers[-1]))
                return self._buffers[-1]

            table = ctx.alloc_input(4 * n_slots * self.stride)
            self._owned.append((ctx, table))
            self._tables.append(table.view(np.uint32)[:n_slots * self.stride].reshape(n_slots, self.stride))
            self._tables[-1][:] = 0
            for _ in stage.layers:
                if kv_type == "f16":
                    self.layers.append(PagedCache(alloc(2 * rows * width), alloc(2 * rows * width), table,
                                                  BLOCK_TOKENS, self.stride))
                else:
                    scales = 2 * rows * width // Q8_GROUP
                    self.layers.append(PagedCache(alloc(rows * width), alloc(rows * width), table, BLOCK_TOKENS,
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
        for table in self._tables:
            table[slot, :len(blocks.blocks)] = blocks.blocks

    def stats(self) -> dict:
        return {"kv_blocks_used": self.pool.used, "kv_blocks_total": self.pool.n_blocks,
                "kv_blocks_cached": self.pool.cached, "prefix_hit_tokens": self.pool.hit_tokens}

    def free(self):
        for ctx, buffer in self._owned:
            ctx.free(buffer)
        self._buffers, self._owned = [], []

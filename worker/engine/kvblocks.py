"""Which blocks of the paged KV cache hold what (no Vulkan here: kvcache.py owns the memory).

A block holds the K/V rows of BLOCK_TOKENS consecutive positions of one sequence. Blocks are
reference counted: a sequence holds the blocks its block table names. A full block is also
content-addressed by the token prefix it ends (a hash chain over the blocks' tokens, vLLM's
automatic prefix caching): a joining sequence whose prompt starts with the same full blocks
holds those instead of prefilling them. A cached block no sequence holds stays cached, idle,
until memory is needed: then the least recently used idle block is taken first (after the
never-cached free blocks). Shared blocks are never written: a sequence writes only positions
past its reused prefix, which ends on a block boundary."""
import hashlib
from collections import OrderedDict, deque

import numpy as np

BLOCK_TOKENS = 16   # positions per block (vLLM's default)


def chain(parent: bytes, tokens) -> bytes:
    """The digest of a full block holding `tokens` after the prefix whose digest is `parent`."""
    return hashlib.blake2b(parent + np.asarray(tokens, "<u4").tobytes(), digest_size=16).digest()


class BlockPool:
    def __init__(self, n_blocks: int):
        self.n_blocks = n_blocks
        self._free = deque(range(n_blocks))    # holding nothing anyone may reuse
        self._refs = [0] * n_blocks
        self._digest: dict[int, bytes] = {}    # cached block -> its digest
        self._cached: dict[bytes, int] = {}    # digest -> cached block
        self._idle: OrderedDict[int, None] = OrderedDict()   # cached, held by none, least recent first
        self.hit_tokens = 0                    # positions joining sequences did not prefill

    @property
    def available(self) -> int:
        """Blocks a sequence could take now (free, or cached and idle)."""
        return len(self._free) + len(self._idle)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - self.available

    @property
    def cached(self) -> int:
        return len(self._cached)

    def allocate(self) -> int | None:
        """A block for one holder, or None when every block is held."""
        if self._free:
            block = self._free.popleft()
        elif self._idle:
            block, _ = self._idle.popitem(last=False)
            del self._cached[self._digest.pop(block)]
        else:
            return None
        self._refs[block] = 1
        return block

    def lookup(self, digest: bytes) -> int | None:
        """The cached block of `digest`, now held once more, or None."""
        block = self._cached.get(digest)
        if block is not None:
            if self._refs[block] == 0:
                del self._idle[block]
            self._refs[block] += 1
        return block

    def register(self, block: int, digest: bytes):
        """`block` (held, full, written) holds the prefix of `digest`; a prefix cached already
        keeps its block."""
        if digest not in self._cached and block not in self._digest:
            self._cached[digest], self._digest[block] = block, digest

    def release(self, blocks):
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._digest:
                    self._idle[block] = None
                else:
                    self._free.append(block)


class SequenceBlocks:
    """One sequence's blocks, in position order, and the digests of its full blocks so far."""

    def __init__(self, pool: BlockPool):
        self.pool, self.blocks, self._digests = pool, [], []

    def reuse_prefix(self, ids: list[int]) -> int:
        """Holds the cached blocks of the longest cached prefix of ids, keeping at least the last
        token to compute (its logits start the generation); returns the positions they cover."""
        assert not self.blocks
        parent = b""
        for i in range((len(ids) - 1) // BLOCK_TOKENS):
            digest = chain(parent, ids[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS])
            block = self.pool.lookup(digest)
            if block is None:
                break
            self.blocks.append(block)
            self._digests.append(digest)
            parent = digest
        hit = len(self.blocks) * BLOCK_TOKENS
        self.pool.hit_tokens += hit
        return hit

    def reserve(self, n_positions: int) -> bool:
        """Blocks for positions 0..n_positions-1; False (holding what it got) when the pool ran out."""
        while len(self.blocks) * BLOCK_TOKENS < n_positions:
            block = self.pool.allocate()
            if block is None:
                return False
            self.blocks.append(block)
        return True

    def blocks_short(self, n_positions: int) -> int:
        """Blocks still to take to hold n_positions positions."""
        return max(0, -(-n_positions // BLOCK_TOKENS) - len(self.blocks))

    def commit(self, tokens: list[int], n_written: int):
        """Tokens 0..n_written-1 have their K/V written: their full blocks become reusable."""
        parent = self._digests[-1] if self._digests else b""
        for i in range(len(self._digests), n_written // BLOCK_TOKENS):
            parent = chain(parent, tokens[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS])
            self._digests.append(parent)
            self.pool.register(self.blocks[i], parent)

    def release(self):
        # last block first: the least recently used idle block is then a prefix's tail, not the
        # head that its later blocks are only reachable through
        self.pool.release(reversed(self.blocks))
        self.blocks, self._digests = [], []

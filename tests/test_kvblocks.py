"""The paged KV cache's block bookkeeping (worker/engine/kvblocks.py), without a device: prefix
reuse by content, reference counts, LRU eviction of idle cached blocks."""
from worker.engine.kvblocks import BLOCK_TOKENS, BlockPool, SequenceBlocks

B = BLOCK_TOKENS


def written(pool, tokens) -> SequenceBlocks:
    """A sequence that held and wrote `tokens`."""
    seq = SequenceBlocks(pool)
    assert seq.reserve(len(tokens))
    seq.commit(tokens, len(tokens))
    return seq


def test_a_shared_prefix_reuses_full_blocks_only():
    pool = BlockPool(8)
    first = written(pool, list(range(2 * B + 5)))
    again = SequenceBlocks(pool)
    # 2 full blocks shared; the third differs in its last token (not full anyway)
    assert again.reuse_prefix(list(range(2 * B)) + [999] * 9) == 2 * B
    assert again.blocks == first.blocks[:2] and pool.hit_tokens == 2 * B
    other = SequenceBlocks(pool)
    assert other.reuse_prefix([7] + list(range(1, 3 * B))) == 0   # first block differs: nothing after counts


def test_the_last_prompt_token_is_always_computed():
    pool = BlockPool(4)
    written(pool, list(range(2 * B)))
    seq = SequenceBlocks(pool)
    assert seq.reuse_prefix(list(range(2 * B))) == B   # exactly two blocks long: the second is recomputed


def test_blocks_return_when_unreferenced_and_cached_ones_go_last_and_least_recent_first():
    pool = BlockPool(4)
    a = written(pool, list(range(B)))          # one full block, cached
    b = written(pool, list(range(100, 100 + B + 3)))   # one full (cached), one partial
    assert pool.available == 1 and pool.used == 3
    a.release()
    b.release()
    assert pool.available == 4 and pool.used == 0 and pool.cached == 2
    # the never-cached free blocks go first, then idle cached ones, least recently released first
    holder = SequenceBlocks(pool)
    assert holder.reserve(2 * B) and pool.cached == 2
    assert holder.reserve(3 * B) and pool.cached == 1
    assert SequenceBlocks(pool).reuse_prefix(list(range(B)) + [1]) == 0        # a's block was the oldest
    assert SequenceBlocks(pool).reuse_prefix(list(range(100, 100 + B)) + [1]) == B
    assert not holder.reserve(5 * B)   # every block is held


def test_a_held_cached_block_is_never_evicted():
    pool = BlockPool(2)
    a = written(pool, list(range(B)))
    user = SequenceBlocks(pool)
    assert user.reuse_prefix(list(range(B)) + [5]) == B
    a.release()
    holder = SequenceBlocks(pool)
    assert holder.reserve(B) and not holder.reserve(2 * B)   # the shared block stays with its user
    assert pool.cached == 1


def test_a_prefix_already_cached_keeps_its_block():
    pool = BlockPool(4)
    tokens = list(range(B))
    a, b = written(pool, tokens), written(pool, tokens)   # two sequences prefilled the same block
    assert a.blocks != b.blocks and pool.cached == 1
    b.release()
    assert pool.available == 3 and pool.cached == 1      # b's copy was never cached: it is free again
    assert SequenceBlocks(pool).reuse_prefix(tokens + [1]) == B

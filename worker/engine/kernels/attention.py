"""The KV cache append and causal grouped-query attention over f16 caches [n_ctx, n_head_kv,
head_dim]. Positions and lengths come from the step buffer ([0] = position of the first token),
so a recorded command buffer replays for every token.

Attention runs one workgroup per (token, KV head, split of the sequence); the query heads of a
GQA group share the workgroup and its K/V reads (attention.comp says how the work is laid out). When tokens x KV heads alone give too few
workgroups (decode), the sequence is split (flash-decoding) and attention_merge combines the
partials by log-sum-exp; the split count is fixed at record time from the cache capacity, and
splits past the current length finish at once."""
from worker.engine.kernels.launch import scratch, stride_groups, threads
from worker.engine.vk.commands import Recording, pack_push
from worker.engine.vk.memory import Buffer

ACCUMULATORS = 64        # f32 accumulators per invocation: heads per workgroup x head_dim / 8
LANES = 8                # invocations sharing one position (attention.comp)
MIN_CHUNK = 128          # positions per split at least, so a split's fixed cost stays small
TARGET_WORKGROUPS = 1024  # enough workgroups to keep a large GPU's loads in flight in decode
MERGE_THREADS = 64


def kv_store(rec: Recording, src: Buffer, cache: Buffer, step: Buffer, n_tokens: int, width: int):
    """src f32 [n_tokens, width] -> rows step[0] .. step[0] + n_tokens - 1 of the f16 cache [n_ctx, width]."""
    size = threads(rec.ctx)
    n = n_tokens * width
    rec.dispatch(rec.ctx.kernel("kv_store", {0: size}), [src, cache, step],
                 (stride_groups(rec.ctx, n, size), 1, 1), pack_push(n, width))


def attention_threads(ctx) -> int:
    """Invocations per attention workgroup: whole subgroups, 4 to 16 positions in flight."""
    return max(32, min(128, 4 * ctx.info.subgroup_size))


def attention(rec: Recording, q: Buffer, k_cache: Buffer, v_cache: Buffer, out: Buffer, step: Buffer,
              n_tokens: int, n_head: int, n_head_kv: int, head_dim: int, scale: float, splits: int | None = None):
    """out[t, h] = softmax(scale * q[t, h] . K[0..pos0+t, h // group]) V[...], q and out f32
    [n_tokens, n_head, head_dim]. `splits` overrides the automatic split count. With more than one
    split this records two dispatches with a barrier between them (the partials live in scratch)."""
    assert n_head % n_head_kv == 0 and head_dim % 4 == 0
    ctx = rec.ctx
    size = attention_threads(ctx)
    group = n_head // n_head_kv
    max_rows = max(1, ACCUMULATORS * LANES // head_dim)
    row_groups = -(-group // max_rows)
    rows = -(-group // row_groups)
    n_ctx = k_cache.size // (n_head_kv * head_dim * 2)
    base_groups = n_tokens * n_head_kv * row_groups
    if splits is None:
        splits = max(1, min(-(-TARGET_WORKGROUPS // base_groups), -(-n_ctx // MIN_CHUNK)))
    chunk = -(-n_ctx // splits)
    chunk = -(-chunk // size) * size
    splits = -(-n_ctx // chunk)
    spec = {0: size, 1: head_dim, 2: rows}
    push = pack_push(n_head, n_head_kv, group, row_groups, chunk, float(scale))
    groups = (splits, n_head_kv * row_groups, n_tokens)
    if splits == 1:
        rec.dispatch(ctx.kernel("attention", spec), [q, k_cache, v_cache, step, out], groups, push)
        return
    part_o = scratch(ctx, "attention_o", n_tokens * n_head * splits * head_dim * 4)
    part_ml = scratch(ctx, "attention_ml", n_tokens * n_head * splits * 8)
    rec.dispatch(ctx.kernel("attention_split", spec), [q, k_cache, v_cache, step, part_o, part_ml], groups, push)
    rec.barrier()
    rec.dispatch(ctx.kernel("attention_merge", {0: MERGE_THREADS}), [part_o, part_ml, out], (n_head, n_tokens, 1),
                 pack_push(splits, head_dim))

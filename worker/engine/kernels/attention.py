"""Causal grouped-query attention over the paged KV cache (kernels/paged.py, f16 or 8-bit). Each
token's sequence slot and position come from the step buffer (uint32 pairs), so one pass serves
tokens of several sequences of different lengths, and a recorded command buffer replays for
every step.

Attention runs one workgroup per (token, KV head, split of the sequence); the query heads of a
GQA group share the workgroup and its K/V reads (attention.comp says how the work is laid
out). When tokens x KV heads alone give too few workgroups (decode), the sequence is split
(flash-decoding), and the last split of a token's heads to finish merges the partials by
log-sum-exp in the same dispatch (a counter per token and heads in the scratch); the split count is
fixed at record time (from the workgroups and the longest sequence the cache holds,
shape.n_ctx), and the shader shares each token's positions among the splits by its own length
(MIN_CHUNK positions a split at least; a token whose positions fit one split has it write the
output with no partials and no merge). The partials and counters live in a buffer the caller
owns, of split_scratch_bytes, zeroed once when it is allocated (the merging split leaves its
counter at 0).

Passes of TILED_MIN_TOKENS tokens or more (prefill chunks) take flash attention on matrix units
where the device has 16x16x16 f16 cooperative matrices and the cache is f16
(attention_tiled.comp): the host cuts each pass into tiles of up to TILE_ROWS tokens of one
sequence (`write_tiles`, into a host-visible buffer of tiles_bytes the caller owns), and one
workgroup per tile and query head walks the positions they see.

Decode passes (one token, or batched: one token a sequence) over an f16 cache take
rope_store_kv's work too (OwnKV: q, k and v as the Q/K/V product wrote them): the kernel rotates
q and k itself, reads each token's own K/V from shared memory and appends them to the cache,
one dispatch and barrier less a layer (H200, Qwen2.5-32B: 19.8 us a layer against 16.7 + 6.1
for attention and rope_store_kv; the 8B's tg128 369.7 tok/s against 362.5 in the same run)."""
import math
from dataclasses import dataclass

import numpy as np

from worker.engine import compilers
from worker.engine.intmath import cdiv, round_up
from worker.engine.kernels.paged import PagedCache
from worker.engine.kernels.paths import X8_BLOCK_VALUES
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.x8 import quantize_x8
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer

ACCUMULATORS = 64        # f32 accumulators per invocation: heads per workgroup x head_dim / LANES
LANES = 8                # invocations sharing one position (attention.comp's LANES)
# Positions per split at least (and the split count at most n_ctx / MIN_CHUNK), so a split's fixed
# cost (and the merge's per split) stays small.
# H200, decode at position 600 of 656 (split attention + merge, us a layer; tg128 tok/s): 1B
# 16.2 + 4.9 at 128 (724.9), 12.3 + 5.7 at 64 (721.8, 738.7 again), 10.4 + 9.7 at 16 (711.7);
# 8B 19.0 + 5.7 (284.3), 14.2 + 7.1 (287.0, 288.1), 13.2 + 12.3 (270.7); Qwen3-30B-A3B 18.6 +
# 6.0 (243.2), 13.7 + 7.3 (244.2, 243.8), 13.3 + 12.6 (228.2).
MIN_CHUNK = 64
# Sequences of up to SHORT_SPAN visible positions split every SHORT_CHUNK at least: there more
# workgroups pay for their merge. H200, attention with RoPE a layer (us) at positions 31 / 63 /
# 127 / 255 / 511 with 32 at least against 64: Qwen2.5-32B 10.2 / 11.5 / 12.5 / 14.6 / 18.7
# against 12.0 / 14.8 / 16.1 / 15.9 / 17.4, Llama-8B 10.5 / 13.6 / 13.3 / 14.3 / 16.6 against
# 10.8 / 12.5 / 13.6 / 13.8 / 14.8; tg128 of the 32B 108.6 tok/s against 107.3, the 8B's 363.6
# against 363.0.
SHORT_CHUNK = 32
SHORT_SPAN = 256
TARGET_WORKGROUPS = 1024  # enough workgroups to keep a large GPU's loads in flight in decode
# A pass of 2 to TILED_MIN_TOKENS - 1 tokens (batched decode, a short prompt: `_few_tokens`)
# splits towards fewer workgroups, of BATCH_THREADS invocations (`attention_threads`; a longer
# pass, a prefill chunk where the device has no tiled kernel, keeps one token's target and
# workgroup: not measured otherwise): each split's fixed cost (its q loads and
# rotation, the merge of its streams and of the splits) is paid per token there. H100, the 8B's
# sequences decoding together (bench --batch 1,8,32 -p 64 -n 256; target / threads, tok/s at 8
# and 32 sequences): 1024 / 128 (one token's) 1264.4, 2741.7; 256 / 64 1292.2, 2916.9 and again
# 1292.0, 2912.6; 256 / 128 1280.9, 2897.3; 128 / 64 1272.4, 2912.8; 256 / 32 1250.8, 2825.6;
# as committed against one token's, again: 1293.3, 2913.7 against 1265.0, 2744.1.
BATCH_TARGET_WORKGROUPS = 256
BATCH_THREADS = 64
OFFSET_ALIGN = 256       # the largest minStorageBufferOffsetAlignment Vulkan allows
TILE_SUBGROUPS = 4       # attention_tiled.comp's subgroups a workgroup, 16 rows each
TILE_ROWS = 16 * TILE_SUBGROUPS
TILE_KV = 32             # K/V positions a step of attention_tiled.comp (TILE_ROWS <= 2 * TILE_KV)
TILED_MIN_TOKENS = 128   # fewer tokens (decode, batched decode) keep attention.comp and its splits
TILED_MAX_HEAD_DIM = 128  # a row's accumulators live in its lanes' registers (HEAD_DIM / 2 each on 32 lanes)


@dataclass(frozen=True)
class OwnKV:
    """The pass's k and v (f32 [n_tokens, n_head_kv * head_dim]) as the Q/K/V product wrote
    them, with what rope_store_kv would take: Llama 3's frequency factors, the projections'
    biases (q, k, v). With it, q is the unrotated product too."""
    k: Buffer
    v: Buffer
    freq_factors: Buffer | None = None
    bias: tuple[Buffer, Buffer, Buffer] | None = None


def takes_rope(cache: PagedCache, n_tokens: int, qk_norm: bool, distinct: bool = False) -> bool:
    """Whether attention can do rope_store_kv's work in the pass (OwnKV): no token of the pass
    reads another's K/V, so one token, or `distinct` ones, each the only one of its sequence (a
    batched decode pass; its pads repeat its last token, writing the same row again); an f16
    cache; no per-head norms, which only rope_store_kv applies."""
    return (n_tokens == 1 or distinct) and not cache.q8 and not qk_norm


def takes_tiles(shape: AttentionShape, cache: PagedCache, n_tokens: int, own: bool) -> bool:
    """Whether a pass of n_tokens takes the tiled kernel where the device has it (`attention`):
    TILED_MIN_TOKENS or more over an f16 cache, heads of up to TILED_MAX_HEAD_DIM values, and
    not appending its own K/V (`own`, takes_rope)."""
    return (n_tokens >= TILED_MIN_TOKENS and not cache.q8 and shape.head_dim % 16 == 0
            and shape.head_dim <= TILED_MAX_HEAD_DIM and not own)


def attention_threads(ctx, n_tokens: int) -> int:
    """Invocations per attention workgroup of a pass of n_tokens: whole subgroups, 4 to 16
    positions in flight (to 8 in a pass of a few tokens, BATCH_THREADS)."""
    most = BATCH_THREADS if _few_tokens(n_tokens) else 128
    return max(32, min(most, 4 * ctx.info.subgroup_size))


def _few_tokens(n_tokens: int) -> bool:
    """Whether a pass takes the split target and workgroups of a few tokens (BATCH_TARGET_WORKGROUPS)."""
    return 1 < n_tokens < TILED_MIN_TOKENS


@dataclass(frozen=True)
class _Plan:
    rows: int          # query heads per workgroup
    row_groups: int    # workgroups per KV head
    splits: int


def _plan(shape: AttentionShape, n_tokens: int, splits: int | None) -> _Plan:
    max_rows = max(1, ACCUMULATORS * LANES // shape.head_dim)
    row_groups = cdiv(shape.group, max_rows)
    rows = cdiv(shape.group, row_groups)
    if splits is None:
        base_groups = n_tokens * shape.n_head_kv * row_groups
        target = BATCH_TARGET_WORKGROUPS if _few_tokens(n_tokens) else TARGET_WORKGROUPS
        most = max(cdiv(shape.n_ctx, MIN_CHUNK), cdiv(min(shape.n_ctx, SHORT_SPAN), SHORT_CHUNK))
        splits = max(1, min(cdiv(target, base_groups), most))
    return _Plan(rows, row_groups, splits)


# Counters of the merging split, one per token and workgroup of heads: a pass splits only while
# those are fewer than TARGET_WORKGROUPS (`_plan`), so a region of that many words at the start
# of the scratch serves every pass, and no partials of another pass ever land on it.
COUNTER_BYTES = round_up(4 * TARGET_WORKGROUPS, OFFSET_ALIGN)


def _scratch_parts(shape: AttentionShape, n_tokens: int, plan: _Plan) -> tuple[int, int, int]:
    """Bytes of the counters, of the partial outputs and of their (max, sum) pairs, each part
    starting where the one before ends."""
    return (COUNTER_BYTES, round_up(n_tokens * shape.n_head * plan.splits * shape.head_dim * 4, OFFSET_ALIGN),
            n_tokens * shape.n_head * plan.splits * 8)


def split_scratch_bytes(shape: AttentionShape, max_tokens: int, splits: int | None = None) -> int:
    """Bytes of the `scratch` buffer that attention needs for any pass of up to max_tokens tokens
    (0: it never splits). `splits` as given to attention. Zero it once (Workspace.allocate does)."""
    need = 0
    for n in range(1, max_tokens + 1):
        plan = _plan(shape, n, splits)
        if plan.splits > 1:
            need = max(need, sum(_scratch_parts(shape, n, plan)))
    return need


def tiled_attention(ctx) -> bool:
    """Whether the device takes attention_tiled.comp (its f16 cooperative matrices and shared
    memory, and a compiler here for them; head sizes and the cache's type are the pass's to
    check)."""
    subgroup = ctx.info.subgroup_size
    shared = 2 * (2 * TILE_KV * (TILED_MAX_HEAD_DIM + 8) + TILE_ROWS * (TILE_KV + 8)) + 4 * TILE_ROWS * (TILE_KV + 16)
    return ((16, 16, 16) in ctx.info.coopmat_shapes and subgroup in (16, 32, 64)
            and shared <= ctx.info.max_shared_memory and compilers.supported("cooperative_matrix"))


def tiles_bytes(ctx, max_tokens: int, sequences: int) -> int:
    """Bytes of the tile list (`write_tiles`) for passes of up to max_tokens tokens of up to
    `sequences` sequences; 0 where no pass takes the tiled kernel."""
    if max_tokens < TILED_MIN_TOKENS or not tiled_attention(ctx):
        return 0
    return 8 * (1 + cdiv(max_tokens, TILE_ROWS) + sequences)


def write_tiles(step: np.ndarray, tiles: np.ndarray):
    """tiles (uint32 [capacity, 2]) = the tile count, then (first token, tokens) of each tile: the
    pass's tokens (step: uint32 [n, 2] (slot, position) pairs) in runs of one slot and rising
    positions, cut every TILE_ROWS tokens."""
    n = len(step)
    cut = np.flatnonzero((step[1:, 0] != step[:-1, 0]) | (step[1:, 1] < step[:-1, 1])) + 1
    starts, ends = np.r_[0, cut], np.r_[cut, n]
    firsts = np.concatenate([np.arange(a, b, TILE_ROWS) for a, b in zip(starts, ends)])
    counts = np.minimum(TILE_ROWS, np.repeat(ends, -(-(ends - starts) // TILE_ROWS)) - firsts)
    if len(firsts) + 1 > len(tiles):
        raise ValueError(f"a pass of {n} tokens in {len(starts)} runs makes {len(firsts)} attention tiles, "
                         f"more than the {len(tiles) - 1} its buffer holds")
    tiles[0, 0] = len(firsts)
    tiles[1:1 + len(firsts), 0], tiles[1:1 + len(firsts), 1] = firsts, counts


def attention(rec: Recording, shape: AttentionShape, q: Buffer, cache: PagedCache, out: Buffer,
              step: Buffer, n_tokens: int, scratch: Buffer | None = None, splits: int | None = None,
              sinks: Buffer | None = None, x8: Buffer | None = None, tiles: Buffer | None = None,
              own: OwnKV | None = None):
    """out[t, h] = softmax(scale * q[t, h] . K[0..pos_t, h // group]) V[...] over the positions of
    token t's sequence (slot step[2t], position pos_t = step[2t + 1]; only the last
    shape.window positions of that range when the window is set), q and out f32
    [n_tokens, n_head, head_dim]. `splits` overrides the automatic split count. With more than one
    split the partials and counters are in `scratch` (split_scratch_bytes, zeroed when
    allocated). `sinks` (f32 [n_head], gpt-oss): each head's sink logit joins the softmax's
    denominator. `x8`: the output in 8-bit blocks there too (x8.glsl, for the 8-bit products;
    n_head x head_dim a multiple of 32), written by the attention kernel itself where heads are
    whole blocks (by the merging split where the sequence splits; one dispatch and barrier less
    than a quantize_x8 after it), else by a quantize_x8 after a barrier. `tiles`: the pass's
    tile list (write_tiles; None: the device has no tiled kernel), for passes of
    TILED_MIN_TOKENS or more over an f16 cache and heads of up to TILED_MAX_HEAD_DIM values.
    `own` (where takes_rope: each token the only one of its sequence in the pass): q, and the
    tokens' k and v in it, as the Q/K/V product wrote them; the kernel rotates them and appends
    k and v to the cache, as rope_store_kv would first."""
    if own is not None and cache.q8:
        raise ValueError("attention appends K/V to an f16 cache; an 8-bit one's rows are rope_store_kv's")
    if tiles is not None and splits is None and takes_tiles(shape, cache, n_tokens, own is not None):
        _record_tiled(rec, shape, q, cache, out, step, n_tokens, sinks, tiles)
        written = False
    else:
        merged = x8 if x8 is not None and shape.head_dim % X8_BLOCK_VALUES == 0 else None
        written = _record(rec, shape, q, cache, out, step, n_tokens, scratch, splits, sinks, merged, own)
    if not written and x8 is not None:
        rec.barrier()
        quantize_x8(rec, out, x8, n_tokens, shape.n_head * shape.head_dim)


def _record_tiled(rec: Recording, shape: AttentionShape, q: Buffer, cache: PagedCache, out: Buffer, step: Buffer,
                  n_tokens: int, sinks: Buffer | None, tiles: Buffer):
    ctx = rec.ctx
    subgroup = ctx.info.subgroup_size
    spec = {0: TILE_SUBGROUPS * subgroup, 1: shape.head_dim, 2: subgroup, 3: TILE_KV, 5: cache.block}
    push = dict(n_head=shape.n_head, n_head_kv=shape.n_head_kv, group=shape.group, scale=float(shape.scale),
                window=shape.window, table_stride=cache.table_stride)
    sink_suffix, sink_buffers = ("_sinks", [sinks]) if sinks is not None else ("", [])
    groups = (min(tiles.size // 8 - 1, n_tokens), shape.n_head, 1)
    rec.dispatch(ctx.kernel("attention_tiled" + sink_suffix, spec),
                 [q, cache.k, cache.v, step, cache.table, tiles, out, *sink_buffers], groups, push)


def _record(rec: Recording, shape: AttentionShape, q: Buffer, cache: PagedCache, out: Buffer, step: Buffer,
            n_tokens: int, scratch: Buffer | None, splits: int | None, sinks: Buffer | None,
            x8: Buffer | None, own: OwnKV | None) -> bool:
    """attention's dispatch; True where it wrote x8 too."""
    ctx = rec.ctx
    size = attention_threads(ctx, n_tokens)
    plan = _plan(shape, n_tokens, splits)
    splits = plan.splits
    spec = {0: size, 1: shape.head_dim, 2: plan.rows, 3: LANES, 5: cache.block}
    push = dict(n_head=shape.n_head, n_head_kv=shape.n_head_kv, group=shape.group, row_groups=plan.row_groups,
                min_chunk=round_up(MIN_CHUNK, size // LANES), short_chunk=round_up(SHORT_CHUNK, size // LANES),
                short_span=SHORT_SPAN, scale=float(shape.scale), window=shape.window,
                table_stride=cache.table_stride)
    groups = (splits, shape.n_head_kv * plan.row_groups, n_tokens)
    suffix, extra = cache.suffix, []
    if own is not None:
        suffix, extra = "_rope", [own.k, own.v, cache.k, cache.v]   # the pools again, written
        spec[4] = int(shape.rope_neox)
        push.update(rope_dim=shape.rope_dim, log2_base=math.log2(shape.rope_base))
        if own.freq_factors is not None:
            suffix, extra = suffix + "_freq_factors", extra + [own.freq_factors]
        if own.bias is not None:
            suffix, extra = suffix + "_bias", extra + list(own.bias)
    if sinks is not None:
        suffix += "_sinks"
    if x8 is not None:
        suffix += "_x8"
    tail = [*cache.scales, *([sinks] if sinks is not None else []), *([x8] if x8 is not None else []), *extra]
    kv = [q, cache.k, cache.v, step, cache.table]
    if splits == 1:
        rec.dispatch(ctx.kernel("attention" + suffix, spec), [*kv, out, *tail], groups, push)
        return x8 is not None
    if groups[1] * n_tokens > TARGET_WORKGROUPS:
        raise ValueError(f"attention splits passes of at most {TARGET_WORKGROUPS} tokens x workgroups of heads, "
                         f"not {groups[1] * n_tokens}")
    c_bytes, o_bytes, ml_bytes = _scratch_parts(shape, n_tokens, plan)
    if scratch is None or scratch.size < c_bytes + o_bytes + ml_bytes:
        raise ValueError(f"attention over {splits} splits needs {c_bytes + o_bytes + ml_bytes} bytes of scratch")
    counters, part_o, part_ml = (scratch.sub(0, c_bytes), scratch.sub(c_bytes, o_bytes),
                                 scratch.sub(c_bytes + o_bytes, ml_bytes))
    rec.dispatch(ctx.kernel("attention_split" + suffix, spec), [*kv, part_o, part_ml, out, counters, *tail], groups,
                 push)
    return x8 is not None

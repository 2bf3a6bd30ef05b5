#version 450
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Causal grouped-query attention over a paged K/V cache (kv_cache.glsl) for queries
// q [n_tokens, n_head, HEAD_DIM]: token t belongs to the sequence in slot tokens[t].x and sits at
// position tokens[t].y of it, so one pass serves tokens of several sequences of different
// lengths (batched decode, a prefill chunk next to decode tokens). With window > 0 (a
// sliding-window layer) a query at position i sees only positions > i - window (llama.cpp's
// standard SWA mask). Workgroup (s, y, t): token t, kv head g = y / row_groups, its query heads
// g * group + (y % row_groups) * ROWS + r (r < ROWS), and the positions of split s of S (the
// dispatch's x): [first + s * chunk, min(first + (s + 1) * chunk, tokens[t].y + 1)), first the
// first visible position and chunk the token's visible positions over S, rounded up to whole
// streams, or min_chunk if more: every token's splits share its own length, however long the
// longest sequence, and none takes fewer than min_chunk positions, short_chunk where the token
// sees at most short_span (splits past the token's positions finish at once).
// LANES invocations share one position: each loads a few f16vec4 blocks of the K and V rows
// (coalesced), the dot products are summed by subgroup shuffles, and one K/V read serves all
// ROWS heads of the GQA group. The workgroup's STREAMS lane groups walk the positions
// independently, each with its own online softmax (running max m, sum l, accumulator), so no
// barrier sits in the loop and loads of many positions are in flight; the streams are merged by
// log-sum-exp at the end. With SPLIT (flash-decoding) each split that holds positions writes its
// unnormalized result (acc, m, l) to the partials, and the last of them to finish for these heads
// (a counter per (token, y), made visible before it is counted) merges them into the finished
// output: no dispatch and barrier of its own for the merge; it leaves the counter at 0 (the
// caller's scratch starts zeroed). Where the token's positions fit one split (a short sequence),
// that split writes the finished output itself, with no partials and no counter. Otherwise
// (unsplit) each workgroup writes the finished output. With
// SINKS (gpt-oss) each head's learned logit sinks[h] joins the softmax's denominator only:
// out = sum_i e^(s_i - M) v_i / (sum_i e^(s_i - M) + e^(sinks[h] - M)), M the maximum over the
// scores and the sink. With X8 (heads of a multiple of 32 values) the output is also written in
// x8.glsl's 8-bit blocks, the input of the 8-bit products (a block's 8 invocations hold one
// head's values), by the merging split or, unsplit, by each workgroup for its heads.
// With ROPE (decode: every token of the pass from a different sequence) the pass's q, k and v
// come as the Q/K/V product wrote them (qkv_in.glsl: with QKV_BIAS its biases added) and the
// kernel does rope_store_kv.comp's work itself: each workgroup rotates its q heads as it loads
// them; the workgroups whose split ends at the token's own position rotate its k (f16-rounded,
// as the cache holds it) into shared memory and read its K/V from there, and the first of them
// for each KV head appends the row to the cache, which no other workgroup reads this pass. One
// dispatch and barrier less a layer.
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint ROWS = 1;
layout(constant_id = 3) const uint LANES = 8;            // attention.py's LANES
const uint WG = gl_WorkGroupSize.x;
const uint STREAMS = WG / LANES;
const uint BLOCKS = HEAD_DIM / 4;                      // f16vec4 blocks in a row
const uint PER_LANE = (BLOCKS + LANES - 1) / LANES;    // blocks each lane holds
// Positions a lane group loads at once: a stream walks only a few (a split's 64 over 16 streams),
// and one at a time each waited for its own loads (H200, a Qwen2.5-32B layer at position 600 of
// 4096: 20.2 us one, 16.9 two; a Llama-8B one at 600 of 656, 16.4 and 13.8).
const uint POSITIONS = 2;
const float NO_SCORE = -3.0e38;  // a finite "minus infinity": exp(NO_SCORE - m) is 0 with no inf arithmetic

#define KV_TABLE_BINDING 4
#include "kv_cache.glsl"

#if defined(ROPE)
#if defined(KV_Q8)
#error "ROPE appends to an f16 cache only"
#endif
layout(std430, binding = 0) readonly buffer Q { float q[]; };
#else
layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };
#endif
layout(std430, binding = 1) readonly buffer K { KV_VEC4 k4[]; };
layout(std430, binding = 2) readonly buffer V { KV_VEC4 v4[]; };
layout(std430, binding = 3) readonly buffer Step { uvec2 tokens[]; };   // (slot, position) per token
#if defined(SPLIT)
// coherent: the merging workgroup reads what the others wrote
layout(std430, binding = 5) coherent buffer PartO { vec4 part_o4[]; };
layout(std430, binding = 6) coherent buffer PartML { vec2 part_ml[]; };
layout(std430, binding = 7) writeonly buffer O { vec4 o4[]; };
layout(std430, binding = 8) coherent buffer Counters { uint counters[]; };
#define SCALE_BINDING 9
#else
layout(std430, binding = 5) writeonly buffer O { vec4 o4[]; };
#define SCALE_BINDING 6
#endif
#if defined(KV_Q8)
#define SINKS_BINDING (SCALE_BINDING + 2)
#else
#define SINKS_BINDING SCALE_BINDING
#endif
#if defined(SINKS)
layout(std430, binding = SINKS_BINDING) readonly buffer Sinks { float sinks[]; };
#define X8_BINDING (SINKS_BINDING + 1)
#else
#define X8_BINDING SINKS_BINDING
#endif
#if defined(X8)
#include "x8.glsl"
layout(std430, binding = X8_BINDING) writeonly buffer Q8 { uint q8[]; };
#include "x8_store.glsl"
#define ROPE_BINDING (X8_BINDING + 1)
#else
#define ROPE_BINDING X8_BINDING
#endif
layout(push_constant) uniform Push {
    uint n_head; uint n_head_kv; uint group; uint row_groups; uint min_chunk; uint short_chunk; uint short_span;
    float scale; uint window; uint table_stride;
#if defined(ROPE)
    uint rope_dim; float log2_base;
#endif
} p;

#if defined(KV_Q8)
layout(std430, binding = SCALE_BINDING) readonly buffer KS { float16_t k_scale[]; };
layout(std430, binding = SCALE_BINDING + 1) readonly buffer VS { float16_t v_scale[]; };
// block i of 4 values shares the scale of its 32-value group
vec4 load_k(uint i) { return vec4(k4[i]) * float(k_scale[i / (KV_Q8_GROUP / 4)]); }
vec4 load_v(uint i) { return vec4(v4[i]) * float(v_scale[i / (KV_Q8_GROUP / 4)]); }
#else
vec4 load_k(uint i) { return vec4(k4[i]); }
vec4 load_v(uint i) { return vec4(v4[i]); }
#endif

#if defined(ROPE)
layout(std430, binding = ROPE_BINDING) readonly buffer KIn { float k[]; };       // [n_tokens, n_head_kv * HEAD_DIM]
layout(std430, binding = ROPE_BINDING + 1) readonly buffer VIn { float v[]; };
// The cache pools again, for the token's own row: K and V stay readonly, so their loads take the
// read-only path (H200, Qwen2.5-32B layer: 31.4 us a dispatch with K and V read-write)
layout(std430, binding = ROPE_BINDING + 2) writeonly buffer KOut { KV_VEC4 k_out4[]; };
layout(std430, binding = ROPE_BINDING + 3) writeonly buffer VOut { KV_VEC4 v_out4[]; };
#if defined(FREQ_FACTORS)
layout(std430, binding = ROPE_BINDING + 4) readonly buffer FF { float freq_factors[]; };
#define BIAS_BINDING (ROPE_BINDING + 5)
#else
#define BIAS_BINDING (ROPE_BINDING + 4)
#endif
#define NEOX_CONSTANT_ID 4
#include "rope.glsl"
#define Q_WIDTH (p.n_head * HEAD_DIM)
#define KV_WIDTH (p.n_head_kv * HEAD_DIM)
#include "qkv_in.glsl"

shared vec4 k_own_sh[BLOCKS], v_own_sh[BLOCKS];   // the token's own K/V row

// Values 4 blk.. of the q head at base (from_q) or of the k head at src, rotated at pos.
vec4 rotated_block(bool from_q, uint base, uint blk, uint pos) {
    vec4 r;
    [[unroll]] for (uint c = 0; c < 4; c++) {
        const uint d = 4 * blk + c;
        const float x = from_q ? q_in(base, d) : k_in(base, d);
        if (d < p.rope_dim) {
            const uint o = rope_partner(d, p.rope_dim / 2);
            r[c] = rope_value(x, from_q ? q_in(base, o) : k_in(base, o), d, pos, p.rope_dim, p.log2_base);
        } else {
            r[c] = x;
        }
    }
    return r;
}
vec4 q_block(uint t, uint head, uint blk, uint pos) {
    return rotated_block(true, (t * p.n_head + head) * HEAD_DIM, blk, pos);
}
// K and V of position `at` (element i of the pools, block blk of the row): the token's own from
// shared memory (its cache row is written in this pass), the others from the cache.
vec4 k_at(uint at, uint own, uint i, uint blk) { return at == own ? k_own_sh[blk] : load_k(i); }
vec4 v_at(uint at, uint own, uint i, uint blk) { return at == own ? v_own_sh[blk] : load_v(i); }
#else
vec4 q_block(uint t, uint head, uint blk, uint pos) { return q4[(t * p.n_head + head) * BLOCKS + blk]; }
vec4 k_at(uint at, uint own, uint i, uint blk) { return load_k(i); }
vec4 v_at(uint at, uint own, uint i, uint blk) { return load_v(i); }
#endif

shared vec4 q_sh[ROWS * BLOCKS];
shared vec4 acc_sh[STREAMS * BLOCKS];
shared vec2 ml_sh[STREAMS];
#if defined(SPLIT)
shared bool last_sh;
#endif

// The finished output of 4 values: sum / l (with SINKS, the sink joining the denominator), in o4
// and, with X8, in 8-bit blocks (a block is 8 consecutive invocations of one head).
void store_out(uint row, uint blk, uint head, vec4 sum, float big_m, float big_l) {
#if defined(SINKS)
    const float sink = sinks[head], m_all = max(big_m, sink);
    const vec4 result = sum * (exp(big_m - m_all) / (big_l * exp(big_m - m_all) + exp(sink - m_all)));
#else
    const vec4 result = sum * (1.0 / big_l);
#endif
    o4[row * BLOCKS + blk] = result;
#if defined(X8)
    store_x8(row * BLOCKS + blk, result, p.n_head * HEAD_DIM, 0.0);
#endif
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint flat_id = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;  // lane groups inside subgroups
    const uint lane = flat_id % LANES, stream = flat_id / LANES;
    const uint split = gl_WorkGroupID.x, t = gl_WorkGroupID.z;
    const uint g = gl_WorkGroupID.y / p.row_groups;
    const uint first_in_group = (gl_WorkGroupID.y % p.row_groups) * ROWS;
    const uint rows = min(ROWS, p.group - first_in_group);
    const uint head0 = g * p.group + first_in_group;
    const uint slot = tokens[t].x;
    const uint seen = tokens[t].y + 1;   // positions up to and including this token's
    const uint first_visible = p.window != 0 && seen > p.window ? seen - p.window : 0;
    const uint per_split = STREAMS * gl_NumWorkGroups.x;
    const uint visible = seen - first_visible;
    const uint chunk = max(visible <= p.short_span ? p.short_chunk : p.min_chunk,
                           (visible + per_split - 1) / per_split * STREAMS);
    const uint begin = first_visible + split * chunk, end = min(begin + chunk, seen);
    // the splits that hold positions: the first `used` (the others return at once)
    const uint used = min(gl_NumWorkGroups.x, (seen - first_visible + chunk - 1) / chunk);

    if (split >= used) {   // uniform in the workgroup: a split past the positions does nothing
        return;
    }
    const uint own = seen - 1;   // the token's own position
    for (uint i = tid; i < ROWS * BLOCKS; i += WG) {
        q_sh[i] = i / BLOCKS < rows ? q_block(t, head0 + i / BLOCKS, i % BLOCKS, own) * p.scale : vec4(0.0);
    }
#if defined(ROPE)
    const bool holds_own = split == used - 1;   // uniform: the split whose positions end at `own`
    const uint src = (t * p.n_head_kv + g) * HEAD_DIM;
    for (uint blk = tid; blk < BLOCKS && holds_own; blk += WG) {
        k_own_sh[blk] = vec4(f16vec4(rotated_block(false, src, blk, own)));
        v_own_sh[blk] = vec4(f16vec4(v_in(src, 4 * blk), v_in(src, 4 * blk + 1), v_in(src, 4 * blk + 2),
                                      v_in(src, 4 * blk + 3)));
    }
#endif
    barrier();
#if defined(ROPE)
    if (holds_own && gl_WorkGroupID.y % p.row_groups == 0) {
        const uint row_base = (kv_row(slot, own, p.table_stride) * p.n_head_kv + g) * BLOCKS;
        for (uint blk = tid; blk < BLOCKS; blk += WG) {
            k_out4[row_base + blk] = f16vec4(k_own_sh[blk]);
            v_out4[row_base + blk] = f16vec4(v_own_sh[blk]);
        }
    }
#endif

    float m[ROWS], l[ROWS];
    vec4 acc[ROWS * PER_LANE];
    for (uint r = 0; r < ROWS; r++) {
        m[r] = NO_SCORE;
        l[r] = 0.0;
        for (uint b = 0; b < PER_LANE; b++) {
            acc[r * PER_LANE + b] = vec4(0.0);
        }
    }
    // POSITIONS positions a step, every row loaded before any is used, one softmax update for them
    for (uint pos = begin + stream; pos < end; pos += POSITIONS * STREAMS) {
        vec4 kb[POSITIONS * PER_LANE], vb[POSITIONS * PER_LANE];
        [[unroll]] for (uint u = 0; u < POSITIONS; u++) {
            // a position past the end reloads the first (its score is dropped below)
            const uint at = pos + u * STREAMS < end ? pos + u * STREAMS : pos;
            const uint row_base = (kv_row(slot, at, p.table_stride) * p.n_head_kv + g) * BLOCKS;
            for (uint b = 0; b < PER_LANE; b++) {
                const uint blk = lane + b * LANES;
                kb[u * PER_LANE + b] = blk < BLOCKS ? k_at(at, own, row_base + blk, blk) : vec4(0.0);
                vb[u * PER_LANE + b] = blk < BLOCKS ? v_at(at, own, row_base + blk, blk) : vec4(0.0);
            }
        }
        for (uint r = 0; r < ROWS; r++) {
            float s[POSITIONS];
            [[unroll]] for (uint u = 0; u < POSITIONS; u++) {
                s[u] = 0.0;
                for (uint b = 0; b < PER_LANE; b++) {
                    const uint blk = lane + b * LANES;
                    if (blk < BLOCKS) {
                        s[u] += dot(kb[u * PER_LANE + b], q_sh[r * BLOCKS + blk]);
                    }
                }
                for (uint x = LANES / 2; x > 0; x /= 2) {
                    s[u] += subgroupShuffleXor(s[u], x);
                }
                s[u] = pos + u * STREAMS < end ? s[u] : NO_SCORE;
            }
            float m_new = m[r];
            [[unroll]] for (uint u = 0; u < POSITIONS; u++) {
                m_new = max(m_new, s[u]);
            }
            const float alpha = exp(m[r] - m_new);
            m[r] = m_new;
            l[r] *= alpha;
            for (uint b = 0; b < PER_LANE; b++) {
                acc[r * PER_LANE + b] *= alpha;
            }
            [[unroll]] for (uint u = 0; u < POSITIONS; u++) {
                const float w = exp(s[u] - m_new);
                l[r] += w;
                for (uint b = 0; b < PER_LANE; b++) {
                    acc[r * PER_LANE + b] += w * vb[u * PER_LANE + b];
                }
            }
        }
    }

    for (uint r = 0; r < ROWS; r++) {
        if (lane == 0) {
            ml_sh[stream] = vec2(m[r], l[r]);
        }
        for (uint b = 0; b < PER_LANE; b++) {
            const uint blk = lane + b * LANES;
            if (blk < BLOCKS) {
                acc_sh[stream * BLOCKS + blk] = acc[r * PER_LANE + b];
            }
        }
        barrier();
        float big_m = NO_SCORE, big_l = 0.0;
        for (uint s = 0; s < STREAMS; s++) {
            big_m = max(big_m, ml_sh[s].x);
        }
        for (uint s = 0; s < STREAMS; s++) {
            big_l += exp(ml_sh[s].x - big_m) * ml_sh[s].y;
        }
        const uint row = t * p.n_head + head0 + r;
        for (uint blk = tid; blk < BLOCKS && r < rows; blk += WG) {
            vec4 sum = vec4(0.0);
            for (uint s = 0; s < STREAMS; s++) {
                sum += exp(ml_sh[s].x - big_m) * acc_sh[s * BLOCKS + blk];
            }
#if defined(SPLIT)
            if (used > 1) {
                const uint part = row * gl_NumWorkGroups.x + split;
                part_o4[part * BLOCKS + blk] = sum;
                if (blk == 0) {
                    part_ml[part] = vec2(big_m, big_l);
                }
                continue;
            }
#endif
            store_out(row, blk, head0 + r, sum, big_m, big_l);
        }
        barrier();
    }
#if defined(SPLIT)
    // With more than one used split, this one's partials visible device-wide, then counted; the
    // last used split of the token's heads merges them: out = sum_s e^(m_s - M) acc_s /
    // sum_s e^(m_s - M) l_s, M = max_s m_s. A single used split wrote the output itself, and
    // splits past the used ones returned at the start: a cache sized for long sequences (many splits
    // recorded: 64 for 4096 positions) costs short ones neither partials nor a merge.
    if (used == 1) {
        return;
    }
    memoryBarrierBuffer();
    barrier();
    const uint splits = gl_NumWorkGroups.x, counter = t * gl_NumWorkGroups.y + gl_WorkGroupID.y;
    if (tid == 0) {
        last_sh = atomicAdd(counters[counter], 1u) == used - 1;
    }
    barrier();
    if (!last_sh) {
        return;
    }
    memoryBarrierBuffer();
    // a thread per 4 values of a head: a block of x8 is 8 consecutive threads of one head
    for (uint i = tid; i < rows * BLOCKS; i += WG) {
        const uint r = i / BLOCKS, blk = i % BLOCKS;
        const uint row = t * p.n_head + head0 + r, first = row * splits;
        float big_m = NO_SCORE, big_l = 0.0;
        for (uint s = 0; s < used; s++) {
            big_m = max(big_m, part_ml[first + s].x);
        }
        vec4 sum = vec4(0.0);
        for (uint s = 0; s < used; s++) {
            const vec2 ml = part_ml[first + s];
            const float w = exp(ml.x - big_m);
            big_l += w * ml.y;
            sum += w * part_o4[(first + s) * BLOCKS + blk];
        }
        store_out(row, blk, head0 + r, sum, big_m, big_l);
    }
    if (tid == 0) {
        counters[counter] = 0u;   // for the next pass
    }
#endif
}

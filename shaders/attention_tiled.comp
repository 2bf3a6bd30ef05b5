#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Causal grouped-query attention of a pass's prefill chunks on matrix units (flash attention:
// tiles of queries against tiles of K/V with an online softmax; no n x n scores anywhere), over
// the paged f16 K/V cache (kv_cache.glsl). attention.comp computes the same, a token at a time.
// The host cuts the pass into tiles (attention.py's tiles_of): up to BR tokens of one sequence
// slot in order of position; `tiles` holds their count, then (first token, tokens) per tile.
// Workgroup (i, h): tile i, query head h, over the positions the tile's tokens see (from the
// first token's first visible one, llama.cpp's standard SWA mask where window > 0, to the last
// token's own), BC at a time. Each of the SUBGROUPS subgroups owns 16 of the tile's rows: it
// keeps its q rows as f16 cooperative matrices, computes S = q K^T (16 x BC, f32) into shared
// memory, where LPR lanes a row mask it, update the row's running max and sum and write
// P = e^(S - max) as f16; then P V (16 x HEAD_DIM) goes out 16 columns at a time through a
// staging tile into the rows' accumulators, which those lanes hold in registers and rescale.
// The next step's K and V are loaded into registers while this one's are worked on.
// With SINKS (gpt-oss) each head's sink logit joins the softmax's denominator (attention.comp).
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint SUBGROUP = 32;
layout(constant_id = 3) const uint BC = 32;       // K/V positions a step
const uint WG = gl_WorkGroupSize.x;
const uint SUBGROUPS = WG / SUBGROUP;
const uint BR = 16 * SUBGROUPS;                   // tokens a tile
const uint LPR = SUBGROUP / 16;                   // lanes a row
const uint D4 = HEAD_DIM / 4;
const uint STRIDE = D4 + 2;                       // f16vec4 a K/V (or q) row in shared memory, padded
const uint P_STRIDE = BC / 4 + 2;                 // f16vec4 a row of P
const uint COLS = 16 / LPR;                       // accumulator values a lane holds per 16 columns
const uint CHUNKS = HEAD_DIM / 16;
const float NO_SCORE = -3.0e38;

#define KV_TABLE_BINDING 4
#include "kv_cache.glsl"

layout(std430, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };
layout(std430, binding = 2) readonly buffer V { f16vec4 v4[]; };
layout(std430, binding = 3) readonly buffer Step { uvec2 tokens[]; };   // (slot, position) per token
layout(std430, binding = 5) readonly buffer Tiles { uvec2 tiles[]; };   // [0].x: count; then (first, tokens)
layout(std430, binding = 6) writeonly buffer O { vec4 o4[]; };
#if defined(SINKS)
layout(std430, binding = 7) readonly buffer Sinks { float sinks[]; };
#endif
layout(push_constant) uniform Push {
    uint n_head; uint n_head_kv; uint group; float scale; uint window; uint table_stride;
} p;

// K then V of a step (BC rows each); at the start the tile's q rows (BR <= 2 * BC rows)
shared f16vec4 kv_sh[2 * BC * STRIDE];
// the next step's K and V, loaded while the matrix units work on this one's
const uint KV_ITEMS = (BC * D4 + WG - 1) / WG;
f16vec4 k_reg[KV_ITEMS], v_reg[KV_ITEMS];

void load_kv(uint slot, uint g, uint kv0, uint kv_end) {
    [[unroll]] for (uint u = 0; u < KV_ITEMS; u++) {
        const uint i = gl_LocalInvocationID.x + u * WG, pos = kv0 + i / D4;
        k_reg[u] = f16vec4(0.0);
        v_reg[u] = f16vec4(0.0);
        if (i < BC * D4 && pos < kv_end) {
            const uint at = (kv_row(slot, pos, p.table_stride) * p.n_head_kv + g) * D4 + i % D4;
            k_reg[u] = k4[at];
            v_reg[u] = v4[at];
        }
    }
}

void store_kv() {
    [[unroll]] for (uint u = 0; u < KV_ITEMS; u++) {
        const uint i = gl_LocalInvocationID.x + u * WG, j = i / D4;
        if (i < BC * D4) {
            kv_sh[j * STRIDE + i % D4] = k_reg[u];
            kv_sh[(BC + j) * STRIDE + i % D4] = v_reg[u];
        }
    }
}
shared float s_sh[SUBGROUPS * 16 * BC];
shared f16vec4 p_sh[SUBGROUPS * 16 * P_STRIDE];
shared float o_sh[SUBGROUPS * 16 * 16];

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = tid / SUBGROUP, lane = tid % SUBGROUP;
    const uint tile = gl_WorkGroupID.x, h = gl_WorkGroupID.y, g = h / p.group;
    if (tile >= tiles[0].x) {
        return;
    }
    const uvec2 span = tiles[1 + tile];
    const uint first = span.x, count = span.y;
    const uint slot = tokens[first].x;
    const uint pos_first = tokens[first].y, kv_end = tokens[first + count - 1].y + 1;
    const uint kv_begin = p.window != 0 && pos_first + 1 > p.window ? pos_first + 1 - p.window : 0;

    // this lane's row of the tile and its share of the row's columns
    const uint row = sg * 16 + lane / LPR, part = lane % LPR;
    const bool valid = row < count;
    const uint pos_row = valid ? tokens[first + row].y : 0;

    load_kv(slot, g, kv_begin, kv_end);
    for (uint i = tid; i < BR * D4; i += WG) {
        const uint r = i / D4, blk = i % D4;
        kv_sh[r * STRIDE + blk] = r < count ? f16vec4(q4[((first + r) * p.n_head + h) * D4 + blk] * p.scale)
                                            : f16vec4(0.0);
    }
    barrier();
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> qa[CHUNKS];
    [[unroll]] for (uint k = 0; k < CHUNKS; k++) {
        coopMatLoad(qa[k], kv_sh, sg * 16 * STRIDE + 4 * k, STRIDE, gl_CooperativeMatrixLayoutRowMajor);
    }
    barrier();

    float m = NO_SCORE, l = 0.0;
    float acc[CHUNKS * COLS];
    [[unroll]] for (uint i = 0; i < CHUNKS * COLS; i++) {
        acc[i] = 0.0;
    }
    const uint s0 = sg * 16 * BC, p0 = sg * 16 * P_STRIDE, o0 = sg * 256;
    for (uint kv0 = kv_begin; kv0 < kv_end; kv0 += BC) {
        store_kv();
        barrier();
        // the next step's K/V into registers, overlapping this step's matrix work; unbranched (the
        // last step's loads are all past kv_end: zeros, unused), as mul_mat_coopmat.comp's
        load_kv(slot, g, kv0 + BC, kv_end);

        // S = q K^T, 16 positions at a time (K rows read as the columns of B)
        [[unroll]] for (uint c = 0; c < BC / 16; c++) {
            coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> s =
                coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
            [[unroll]] for (uint k = 0; k < CHUNKS; k++) {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> kb;
                coopMatLoad(kb, kv_sh, c * 16 * STRIDE + 4 * k, STRIDE, gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(qa[k], kb, s);
            }
            coopMatStore(s, s_sh, s0 + 16 * c, BC, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // the online softmax of this lane's row over this step's positions
        const uint c0 = part * (BC / LPR);
        float block_max = NO_SCORE;
        [[unroll]] for (uint c = 0; c < BC / LPR; c++) {
            const uint pos = kv0 + c0 + c;
            const bool seen = valid && pos <= pos_row && (p.window == 0 || pos + p.window > pos_row);
            block_max = max(block_max, seen ? s_sh[s0 + (row % 16) * BC + c0 + c] : NO_SCORE);
        }
        [[unroll]] for (uint x = LPR / 2; x > 0; x /= 2) {
            block_max = max(block_max, subgroupShuffleXor(block_max, x));
        }
        const float m_new = max(m, block_max), alpha = exp(m - m_new);
        float sum = 0.0;
        [[unroll]] for (uint c = 0; c < BC / LPR; c += 4) {
            vec4 e;
            [[unroll]] for (uint u = 0; u < 4; u++) {
                const uint pos = kv0 + c0 + c + u;
                const bool seen = valid && pos <= pos_row && (p.window == 0 || pos + p.window > pos_row);
                e[u] = seen ? exp(s_sh[s0 + (row % 16) * BC + c0 + c + u] - m_new) : 0.0;
            }
            sum += e.x + e.y + e.z + e.w;
            p_sh[p0 + (row % 16) * P_STRIDE + (c0 + c) / 4] = f16vec4(e);
        }
        [[unroll]] for (uint x = LPR / 2; x > 0; x /= 2) {
            sum += subgroupShuffleXor(sum, x);
        }
        m = m_new;
        l = l * alpha + sum;
        subgroupMemoryBarrierShared();
        subgroupBarrier();

        // acc = acc * alpha + P V, 16 columns of the head at a time
        coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> pa[BC / 16];
        [[unroll]] for (uint k = 0; k < BC / 16; k++) {
            coopMatLoad(pa[k], p_sh, p0 + 4 * k, P_STRIDE, gl_CooperativeMatrixLayoutRowMajor);
        }
        [[unroll]] for (uint d = 0; d < CHUNKS; d++) {
            coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> pv =
                coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
            [[unroll]] for (uint k = 0; k < BC / 16; k++) {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> vb;
                coopMatLoad(vb, kv_sh, (BC + 16 * k) * STRIDE + 4 * d, STRIDE, gl_CooperativeMatrixLayoutRowMajor);
                pv = coopMatMulAdd(pa[k], vb, pv);
            }
            coopMatStore(pv, o_sh, o0, 16, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint c = 0; c < COLS; c++) {
                acc[d * COLS + c] = acc[d * COLS + c] * alpha + o_sh[o0 + (row % 16) * 16 + part * COLS + c];
            }
            subgroupBarrier();
        }
        barrier();   // every subgroup is done with this step's K and V
    }

    if (!valid) {
        return;
    }
    float norm = 1.0 / l;
#if defined(SINKS)
    const float sink = sinks[h], m_all = max(m, sink);
    norm = exp(m - m_all) / (l * exp(m - m_all) + exp(sink - m_all));
#endif
    const uint o_row = ((first + row) * p.n_head + h) * D4;
    [[unroll]] for (uint d = 0; d < CHUNKS; d++) {
        [[unroll]] for (uint c = 0; c < COLS; c += 4) {
            o4[o_row + (d * 16 + part * COLS + c) / 4] =
                vec4(acc[d * COLS + c], acc[d * COLS + c + 1], acc[d * COLS + c + 2], acc[d * COLS + c + 3]) * norm;
        }
    }
}

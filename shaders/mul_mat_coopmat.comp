#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#if defined(SPLIT_K)
#extension GL_EXT_shader_atomic_float : require
#endif
#include "common.glsl"
#if defined(ITEMS)
#include "mul_mat_vec_items.glsl"
#else
#include "dequant.glsl"
#endif
#include "mul_mat_base.glsl"

// Matrix x matrix on matrix units (VK_KHR_cooperative_matrix): what mul_mat.comp computes, with
// the weight tile dequantized into shared memory as f16, the activations already in f16 (binding
// 1: convert_f16.comp's rows of x, each padded to a multiple of 8 values, copied into the tile as
// they are), and f32 accumulation in TM x TN x TK cooperative matrices (a shape the device
// reports). On an H200 (Q4_K 27648x5120 at 512 columns, the 128x256 tile) reading f32 x and
// converting it here took 1271 us, f16 x 1049: the activation tile's loads and conversions, not
// the matrix units, bound the kernel (1281 -> 631 us with no loads at all, 991 with no matrix work).
// A workgroup computes BM rows x BN columns; its subgroups each own WM x WN of them
// ((WM / TM) x (WN / TN) accumulators), rows first. K goes in steps of BK (a multiple of 16 and
// of TK) through shared memory.
// The next step's weights and activations are loaded into registers while the matrix units work
// on the current one, with no branch around the loads (past the range they give zeros or values
// left unused): behind a branch the compiler kept the dequantization, which waits for the loads,
// apart from the matrix work, and the two took turns (H200, Q4_K at 512 columns, the 128x256
// tile: 27648x5120 1051 -> 846 us, 14336x4096 438 -> 377; Q6_K 5120x27648 1317 -> 1092). Keeping
// the raw quants in registers and dequantizing them at the store instead was slower (991). Loops
// over accumulators are unrolled: an accumulator array indexed at run time would live in local
// memory. y is written through a per-subgroup staging tile, which bounds-checks the edges and
// applies `accumulate`. With SPLIT_K, workgroup z sums the z-th of
// gl_NumWorkGroups.z ranges of K (whole steps) and adds it to y atomically (store_y; y zeroed
// before unless the product accumulates). Sizes are specialization constants, chosen by
// kernels/coopmat.py from the device's shapes; the workgroup size (constant 0) must be
// (BM / WM) * (BN / WN) subgroups.
// With ITEMS (products of few columns), a thread loads whole items of a row (the mat-vec kernel's
// raw 16-byte loads, mul_mat_vec_items.glsl: a Q4_K item is 64 values in 12 words where their
// dequantized f32 take 64) AHEAD steps before their step and dequantizes them at the store: at
// few columns a workgroup's step is short and waits on its loads, so what bounds it is the bytes
// each SM keeps in flight, which staging f32 values one step ahead kept small. The items are
// dequantized in packed f16 arithmetic (halves4: about two instructions a value, where bytes to
// f32, an fma and a conversion back took about five), with K permuted within runs of 4 in both
// tiles. Tried on the H100 and kept out (2026-12-07; gate+up Q4_K at 32 columns, 95-96 us as it
// is): two stages of BK 64, one barrier a step (193; 111 against 85 at 16 columns); x read by
// coopMatLoad straight from xh (245); the weight tile stored down the rows, so that a row's two
// items no longer share banks (103); tiles of 2 subgroups (over 126), of 112 rows, whole rounds of
// the 132 SMs (94.5 against 94.7), of 224 rows at BK 64 (108). Beyond its loads, dequantization
// and matrix work a step costs about 1.2 us (of 32 steps; session 38): the tile stores, the x load
// and two workgroup barriers.
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint WM = 64;
layout(constant_id = 4) const uint WN = 64;
layout(constant_id = 5) const uint TM = 16;
layout(constant_id = 6) const uint TN = 16;
layout(constant_id = 7) const uint TK = 16;
layout(constant_id = 8) const uint SUBGROUP = 32;
layout(constant_id = 9) const uint BK = 32;
// 2: the tiles in shared memory alternate between two buffers, so that storing the next step's
// needs no barrier after the matrix work of this one (one barrier per step instead of two)
layout(constant_id = 10) const uint STAGES = 1;
// Rows of the tiles in 16-byte vectors of 8 f16: BK / 8 plus one of padding against bank conflicts.
const uint STRIDE = BK / 8 + 1;
const uint SUBGROUPS = (BM / WM) * (BN / WN);
const uint THREADS = SUBGROUPS * SUBGROUP;
const uint CM_ROWS = WM / TM, CM_COLS = WN / TN;
// steps whose weights are in registers at once (the current one's and AHEAD - 1 after it)
layout(constant_id = 11) const uint AHEAD = 1;
// What a thread loads of a row at once: an item (BK a multiple of ITEM_VALUES), or 16 values
// dequantized by load_a16.
#if defined(ITEMS)
const uint A_UNIT = ITEM_VALUES;
#define A_REG item_raw
#else
const uint A_UNIT = 16;
#define A_REG mat4
#endif
const uint A_UNITS = BM * (BK / A_UNIT);   // per step
// weight units and 8-value activation vectors per thread and step
const uint A_PER_THREAD = (A_UNITS + THREADS - 1) / THREADS;
const uint X_PER_THREAD = (BN * (BK / 8) + THREADS - 1) / THREADS;

layout(std430, binding = 1) readonly buffer XH { uvec4 xh[]; };   // 8 f16 a vector
shared uvec4 buf_a[STAGES * BM * STRIDE];   // buf_a[r * STRIDE + k / 8]: row-major weights
shared uvec4 buf_x[STAGES * BN * STRIDE];   // buf_x[t * STRIDE + k / 8]: column-major B = x^T
shared float staging[SUBGROUPS * TM * TN];

A_REG reg_a[AHEAD * A_PER_THREAD];   // slot d: steps d, d + AHEAD, ...
uvec4 reg_x[X_PER_THREAD];

uvec4 pack8(vec4 a, vec4 b) {
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

#if defined(ITEMS)
#include "halves4.glsl"
// Eight f16 of x in natural order (pairs 01 23 45 67) into halves4.glsl's (02 13 46 57).
uvec4 interleave8(uvec4 x) {
    return uvec4(interleave4(x.xy), interleave4(x.zw));
}
#endif

// The weights of the step at k0 into slot `slot`. Past the rows or k_end (the range's end) the
// loads read values left unused: zeros, or with ITEMS the last item of the row or range (a row's
// K is a multiple of its blocks, so x is zero at any k past p.ncols that a step holds).
void load_a(uint slot, uint tid, uint row0, uint k0, uint k_end) {
    [[unroll]] for (uint j = 0; j < A_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, row = (i / (BK / A_UNIT)) % BM, k = k0 + A_UNIT * (i % (BK / A_UNIT));
#if defined(ITEMS)
        const uint row_byte = a_row(min(row0 + row, p.rows - 1)) * (p.ncols / QUANT_K) * BLOCK_BYTES;
        reg_a[slot * A_PER_THREAD + j] = load_item(row_byte, min(k, k_end - 1) / ITEM_VALUES);
#else
        reg_a[slot * A_PER_THREAD + j] = i < A_UNITS && row0 + row < p.rows && k < k_end ? load_a16(row0 + row, k)
                                                                                       : mat4(0.0);
#endif
    }
}

// The activations of the step at k0 (zeros past p.ncols).
void load_x(uint tid, uint col0, uint k0) {
    const uint row_vectors = (p.ncols + 7) / 8;   // of a row of x (zeros past ncols)
    [[unroll]] for (uint j = 0; j < X_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, col = col0 + i / (BK / 8), k = k0 + 8 * (i % (BK / 8));
        reg_x[j] = i < BN * (BK / 8) && col < cols_end() && k < p.ncols ? xh[x_col(col) * row_vectors + k / 8]
                                                                          : uvec4(0u);
    }
}

// Slot `slot`'s weights (of the step at k0) and the activations into tiles `stage`.
void store_tiles(uint tid, uint stage, uint slot, uint k0) {
    const uint a0 = stage * BM * STRIDE, x0 = stage * BN * STRIDE;
    [[unroll]] for (uint j = 0; j < A_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, row = i / (BK / A_UNIT), unit = i % (BK / A_UNIT);
        if (i < A_UNITS) {
            const uint v = a0 + row * STRIDE + unit * (A_UNIT / 8);
#if defined(ITEMS)
            const uint item = (k0 + A_UNIT * unit) / ITEM_VALUES;
            const item_words w = align_item(reg_a[slot * A_PER_THREAD + j], item);
            [[unroll]] for (uint g = 0; g < ITEM_GROUPS; g++) {
                vec2 ab;
                const uvec4 q = uvec4(group_quants(w, item, g, ab));
                const f16vec2 a = f16vec2(ab.x), b = f16vec2(ab.y);
                buf_a[v + 2 * g] = uvec4(halves4(q.x, a, b), halves4(q.y, a, b));
                buf_a[v + 2 * g + 1] = uvec4(halves4(q.z, a, b), halves4(q.w, a, b));
            }
#else
            const mat4 a = reg_a[slot * A_PER_THREAD + j];
            buf_a[v] = pack8(a[0], a[1]);
            buf_a[v + 1] = pack8(a[2], a[3]);
#endif
        }
    }
    [[unroll]] for (uint j = 0; j < X_PER_THREAD; j++) {
        const uint i = tid + j * THREADS;
        if (i < BN * (BK / 8)) {
#if defined(ITEMS)
            buf_x[x0 + (i / (BK / 8)) * STRIDE + i % (BK / 8)] = interleave8(reg_x[j]);
#else
            buf_x[x0 + (i / (BK / 8)) * STRIDE + i % (BK / 8)] = reg_x[j];
#endif
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = tid / SUBGROUP, lane = tid % SUBGROUP;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
    const uint warp_r = sg % (BM / WM), warp_c = sg / (BM / WM);

    coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> sums[CM_ROWS * CM_COLS];
    [[unroll]] for (uint i = 0; i < CM_ROWS * CM_COLS; i++) {
        sums[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
    }
    coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a[CM_ROWS];
    coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;

#if defined(SPLIT_K)
    const uint span = (p.ncols + gl_NumWorkGroups.z * BK - 1) / (gl_NumWorkGroups.z * BK) * BK;
    const uint k_begin = gl_WorkGroupID.z * span, k_end = min(p.ncols, k_begin + span);
#else
    const uint k_begin = 0, k_end = p.ncols;
#endif
    [[unroll]] for (uint d = 0; d < AHEAD; d++) {
        load_a(d, tid, row0, k_begin + d * BK, k_end);
    }
    load_x(tid, col0, k_begin);
    // a subgroup stores step s + 1's tiles only after every subgroup passed step s's barrier,
    // so after the matrix work of step s - 1: with two stages that is the other buffer
    uint stage = 0;
    for (uint k0 = k_begin; k0 < k_end; k0 += AHEAD * BK) {
        // slot d holds step k0 + d * BK; it is loaded again with the step AHEAD after it
        [[unroll]] for (uint d = 0; d < AHEAD; d++) {
            const uint k = k0 + d * BK;
            if (AHEAD == 1 || k < k_end) {
                store_tiles(tid, stage, d, k);
                barrier();
                load_a(d, tid, row0, k + AHEAD * BK, k_end);
                load_x(tid, col0, k + BK);
                const uint a0 = stage * BM * STRIDE, x0 = stage * BN * STRIDE;
                [[unroll]] for (uint kk = 0; kk < BK; kk += TK) {
                    [[unroll]] for (uint i = 0; i < CM_ROWS; i++) {
                        coopMatLoad(a[i], buf_a, a0 + (warp_r * WM + i * TM) * STRIDE + kk / 8, STRIDE,
                                    gl_CooperativeMatrixLayoutRowMajor);
                    }
                    [[unroll]] for (uint j = 0; j < CM_COLS; j++) {
                        coopMatLoad(b, buf_x, x0 + (warp_c * WN + j * TN) * STRIDE + kk / 8, STRIDE,
                                    gl_CooperativeMatrixLayoutColumnMajor);
                        [[unroll]] for (uint i = 0; i < CM_ROWS; i++) {
                            sums[j * CM_ROWS + i] = coopMatMulAdd(a[i], b, sums[j * CM_ROWS + i]);
                        }
                    }
                }
                if (STAGES == 1) {
                    barrier();
                }
                stage = (stage + 1) % STAGES;
            }
        }
    }

    // staging[t * TM + r]: column-major, so lanes write consecutive rows of a column of y
    const uint staged = sg * TM * TN;
    [[unroll]] for (uint j = 0; j < CM_COLS; j++) {
        [[unroll]] for (uint i = 0; i < CM_ROWS; i++) {
            coopMatStore(sums[j * CM_ROWS + i], staging, staged, TM, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            const uint r0 = row0 + warp_r * WM + i * TM, c0 = col0 + warp_c * WN + j * TN;
            for (uint e = lane; e < TM * TN; e += SUBGROUP) {
                store_y(r0 + e % TM, c0 + e / TM, staging[staged + e]);
            }
            subgroupBarrier();
        }
    }
}

#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#if defined(SPLIT_K)
#extension GL_EXT_shader_atomic_float : require
#endif
#include "common.glsl"
#include "dequant.glsl"
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
// 16-value weight slices and 8-value activation vectors per thread and step
const uint A_PER_THREAD = (BM * (BK / 16) + THREADS - 1) / THREADS;
const uint X_PER_THREAD = (BN * (BK / 8) + THREADS - 1) / THREADS;

layout(std430, binding = 1) readonly buffer XH { uvec4 xh[]; };   // 8 f16 a vector
shared uvec4 buf_a[STAGES * BM * STRIDE];   // buf_a[r * STRIDE + k / 8]: row-major weights
shared uvec4 buf_x[STAGES * BN * STRIDE];   // buf_x[t * STRIDE + k / 8]: column-major B = x^T
shared float staging[SUBGROUPS * TM * TN];

mat4 reg_a[A_PER_THREAD];
uvec4 reg_x[X_PER_THREAD];

uvec4 pack8(vec4 a, vec4 b) {
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

void load_registers(uint tid, uint row0, uint col0, uint k0) {
    [[unroll]] for (uint j = 0; j < A_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, row = i / (BK / 16), k = k0 + 16 * (i % (BK / 16));
        reg_a[j] = i < BM * (BK / 16) && row0 + row < p.rows && k < p.ncols ? load_a16(row0 + row, k) : mat4(0.0);
    }
    const uint row_vectors = (p.ncols + 7) / 8;   // of a row of x (zeros past ncols)
    [[unroll]] for (uint j = 0; j < X_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, col = col0 + i / (BK / 8), k = k0 + 8 * (i % (BK / 8));
        reg_x[j] = i < BN * (BK / 8) && col < cols_end() && k < p.ncols ? xh[x_col(col) * row_vectors + k / 8]
                                                                          : uvec4(0u);
    }
}

void store_tiles(uint tid, uint stage) {
    const uint a0 = stage * BM * STRIDE, x0 = stage * BN * STRIDE;
    [[unroll]] for (uint j = 0; j < A_PER_THREAD; j++) {
        const uint i = tid + j * THREADS, row = i / (BK / 16), slice = i % (BK / 16);
        if (i < BM * (BK / 16)) {
            buf_a[a0 + row * STRIDE + 2 * slice] = pack8(reg_a[j][0], reg_a[j][1]);
            buf_a[a0 + row * STRIDE + 2 * slice + 1] = pack8(reg_a[j][2], reg_a[j][3]);
        }
    }
    [[unroll]] for (uint j = 0; j < X_PER_THREAD; j++) {
        const uint i = tid + j * THREADS;
        if (i < BN * (BK / 8)) {
            buf_x[x0 + (i / (BK / 8)) * STRIDE + i % (BK / 8)] = reg_x[j];
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
    load_registers(tid, row0, col0, k_begin);
    // a subgroup stores step s + 1's tiles only after every subgroup passed step s's barrier,
    // so after the matrix work of step s - 1: with two stages that is the other buffer
    uint stage = 0;
    for (uint k0 = k_begin; k0 < k_end; k0 += BK) {
        store_tiles(tid, stage);
        barrier();
        load_registers(tid, row0, col0, k0 + BK);
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

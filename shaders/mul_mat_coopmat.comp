#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat_base.glsl"

// Matrix x matrix on matrix units (VK_KHR_cooperative_matrix): what mul_mat.comp computes, with
// the weight tile dequantized into shared memory as f16, the activation tile converted to f16 on
// load, and f32 accumulation in TM x TN x TK cooperative matrices (a shape the device reports).
// A workgroup computes BM rows x BN columns; its subgroups each own WM x WN of them
// ((WM / TM) x (WN / TN) accumulators), rows first. K goes in steps of BK through shared memory.
// y is written through a per-subgroup staging tile, which bounds-checks the edges and applies
// `accumulate`. Sizes are specialization constants, chosen by matmul.py from the device's shapes;
// the workgroup size (constant 0) must be (BM / WM) * (BN / WN) subgroups.
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint WM = 64;
layout(constant_id = 4) const uint WN = 64;
layout(constant_id = 5) const uint TM = 16;
layout(constant_id = 6) const uint TN = 16;
layout(constant_id = 7) const uint TK = 16;
layout(constant_id = 8) const uint SUBGROUP = 32;
const uint BK = 32;
// Rows of the tiles in f16 4-vectors: BK / 4 plus 2 (16 bytes) of padding against bank conflicts.
const uint STRIDE = BK / 4 + 2;
const uint SUBGROUPS = (BM / WM) * (BN / WN);
const uint CM_ROWS = WM / TM, CM_COLS = WN / TN;

shared f16vec4 buf_a[BM * STRIDE];   // buf_a[r * STRIDE + k / 4]: row-major weights
shared f16vec4 buf_x[BN * STRIDE];   // buf_x[t * STRIDE + k / 4]: column-major B = x^T
shared float staging[SUBGROUPS * TM * TN];

void load_tiles(uint tid, uint row0, uint col0, uint k0) {
    for (uint i = tid; i < BM * (BK / 16); i += gl_WorkGroupSize.x) {
        const uint row = i / (BK / 16), slice = i % (BK / 16), k = k0 + 16 * slice;
        const mat4 v = row0 + row < p.rows && k < p.ncols ? load_a16(row0 + row, k) : mat4(0.0);
        for (uint c = 0; c < 4; c++) {
            buf_a[row * STRIDE + 4 * slice + c] = f16vec4(v[c]);
        }
    }
    for (uint i = tid; i < BN * (BK / 4); i += gl_WorkGroupSize.x) {
        const uint col = i / (BK / 4), k4 = i % (BK / 4);
        buf_x[col * STRIDE + k4] = f16vec4(load_x4(col0 + col, k0 + 4 * k4));
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = tid / SUBGROUP, lane = tid % SUBGROUP;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
    const uint warp_r = sg % (BM / WM), warp_c = sg / (BM / WM);

    coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator> sums[CM_ROWS * CM_COLS];
    for (uint i = 0; i < CM_ROWS * CM_COLS; i++) {
        sums[i] = coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>(0.0);
    }
    coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA> a[CM_ROWS];
    coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB> b;

    for (uint k0 = 0; k0 < p.ncols; k0 += BK) {
        load_tiles(tid, row0, col0, k0);
        barrier();
        for (uint kk = 0; kk < BK; kk += TK) {
            for (uint i = 0; i < CM_ROWS; i++) {
                coopMatLoad(a[i], buf_a, (warp_r * WM + i * TM) * STRIDE + kk / 4, STRIDE,
                            gl_CooperativeMatrixLayoutRowMajor);
            }
            for (uint j = 0; j < CM_COLS; j++) {
                coopMatLoad(b, buf_x, (warp_c * WN + j * TN) * STRIDE + kk / 4, STRIDE,
                            gl_CooperativeMatrixLayoutColumnMajor);
                for (uint i = 0; i < CM_ROWS; i++) {
                    sums[j * CM_ROWS + i] = coopMatMulAdd(a[i], b, sums[j * CM_ROWS + i]);
                }
            }
        }
        barrier();
    }

    // staging[t * TM + r]: column-major, so lanes write consecutive rows of a column of y
    const uint stage = sg * TM * TN;
    for (uint j = 0; j < CM_COLS; j++) {
        for (uint i = 0; i < CM_ROWS; i++) {
            coopMatStore(sums[j * CM_ROWS + i], staging, stage, TM, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            const uint r0 = row0 + warp_r * WM + i * TM, c0 = col0 + warp_c * WN + j * TN;
            for (uint e = lane; e < TM * TN; e += SUBGROUP) {
                store_y(r0 + e % TM, c0 + e / TM, staging[stage + e]);
            }
            subgroupBarrier();
        }
    }
}

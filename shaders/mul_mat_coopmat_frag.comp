#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_control_flow_attributes : require
#if defined(SPLIT_K)
#extension GL_EXT_shader_atomic_float : require
#endif
#include "common.glsl"
#include "lane_items.glsl"
#include "mul_mat_base.glsl"
#include "halves4.glsl"

// Matrix x few columns on matrix units with no shared tiles: each lane builds its own elements of
// the 16 x 16 f16 cooperative matrices in registers, the weights' from its own words of their
// blocks (lane_items.glsl), x's straight from its f16 rows (binding 1, as mul_mat_coopmat.comp's).
// That needs the device's layout of a matrix's elements over the lanes, which Vulkan leaves to
// the driver: this kernel assumes the one NVIDIA's driver gives (found on an H100 by
// coopmat_layout.comp; kernels/fragments.py checks it on the device before a product takes this
// kernel), with g = lane / 4 and t = lane % 4:
//   A (16 rows x 16 of K): elements 0-1 row g, K 2t and 2t + 1; 2-3 row g, K 2t + 8 and 2t + 9;
//                          4-7 the same for row g + 8;
//   B (16 of K x 16 columns): elements 0-1 column g, K 2t and 2t + 1; 2-3 column g, K 2t + 8 and
//                          2t + 9; 4-7 the same for column g + 8.
// Fragment K position 2t, 2t + 1, 2t + 8, 2t + 9 is value 4t, 4t + 2, 4t + 1, 4t + 3 of a 16-value
// group (halves4.glsl's order): so a lane's A elements of a row are one word of the group's quants,
// word t (halves4), and its B elements of a column four consecutive f16 of x (interleave4).
// A subgroup owns WM rows (WM / 16 matrices) and all BN columns of the workgroup; its subgroups
// share nothing (no barrier: a workgroup is BM / WM independent subgroups). Per lane item of K
// each lane loads its words of its 2 WM / 16 rows (the next item's while the matrix units work on
// this one), then per 16-value group builds the A matrices of its rows and the B matrices of the
// columns and multiplies. The four lanes of a row each decode its scales: what this costs beyond
// the shared-tile kernel's single decode the shared tile's stores, loads and barriers more than
// pay (kernels/coopmat.py has the times). With SPLIT_K workgroup z takes the z-th of
// gl_NumWorkGroups.z ranges of whole lane items and adds its sums to y atomically. The constants
// are mul_mat_coopmat.comp's (BN = WN; TM = TN = TK = 16 and SUBGROUP = 32 are what the layout
// above has; BK, STAGES and AHEAD unused): kernels/matmul.py dispatches both alike.
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 32;
layout(constant_id = 3) const uint WM = 32;
layout(constant_id = 8) const uint SUBGROUP = 32;
const uint CM_ROWS = WM / 16, CM_COLS = BN / 16, LANE_ROWS = 2 * CM_ROWS;

layout(std430, binding = 1) readonly buffer XH2 { uvec2 xh2[]; };   // 4 f16 an element
shared float staging[(BM / WM) * 256];

coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> frag_a(uvec2 e0, uvec2 e1) {
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    const f16vec2 p0 = unpackFloat2x16(e0.x), p1 = unpackFloat2x16(e0.y);
    const f16vec2 p2 = unpackFloat2x16(e1.x), p3 = unpackFloat2x16(e1.y);
    a[0] = p0.x; a[1] = p0.y; a[2] = p1.x; a[3] = p1.y;
    a[4] = p2.x; a[5] = p2.y; a[6] = p3.x; a[7] = p3.y;
    return a;
}

coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> frag_b(uvec2 e0, uvec2 e1) {
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
    const f16vec2 p0 = unpackFloat2x16(e0.x), p1 = unpackFloat2x16(e0.y);
    const f16vec2 p2 = unpackFloat2x16(e1.x), p3 = unpackFloat2x16(e1.y);
    b[0] = p0.x; b[1] = p0.y; b[2] = p1.x; b[3] = p1.y;
    b[4] = p2.x; b[5] = p2.y; b[6] = p3.x; b[7] = p3.y;
    return b;
}

void main() {
    const uint tid = gl_LocalInvocationID.x, sg = tid / SUBGROUP, lane = tid % SUBGROUP;
    const uint g = lane / 4, t = lane % 4;
    const uint rows0 = gl_WorkGroupID.x * BM + sg * WM, col0 = gl_WorkGroupID.y * BN;
    if (rows0 >= p.rows) {
        return;   // the whole subgroup: it shares no barrier with the others
    }
    const uint items_all = p.ncols / LANE_ITEM_VALUES;
#if defined(SPLIT_K)
    const uint span = (items_all + gl_NumWorkGroups.z - 1) / gl_NumWorkGroups.z;
    const uint begin = gl_WorkGroupID.z * span, end = min(items_all, begin + span);
    if (begin >= end) {
        return;
    }
#else
    const uint begin = 0, end = items_all;
#endif
    // lane row i: row g + 8 (i % 2) of matrix i / 2
    uint row_byte[LANE_ROWS];
    [[unroll]] for (uint i = 0; i < LANE_ROWS; i++) {
        const uint row = min(rows0 + 16 * (i / 2) + 8 * (i % 2) + g, p.rows - 1);
        row_byte[i] = a_row(row) * (p.ncols / QUANT_K) * BLOCK_BYTES;
    }
    // x of column c (c < cols_end(), else zeros) from 4-f16 element x_base + (k / 4)
    const uint row_quads = (p.ncols + 7) / 8 * 2;
    uint x_base[2 * CM_COLS];
    bool x_real[2 * CM_COLS];
    [[unroll]] for (uint j = 0; j < 2 * CM_COLS; j++) {
        const uint col = col0 + 16 * (j / 2) + 8 * (j % 2) + g;
        x_real[j] = col < cols_end();
        x_base[j] = x_col(min(col, cols_end() - 1)) * row_quads + t;
    }

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> sums[CM_ROWS * CM_COLS];
    [[unroll]] for (uint i = 0; i < CM_ROWS * CM_COLS; i++) {
        sums[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    }
    lane_raw raw[LANE_ROWS];
    [[unroll]] for (uint i = 0; i < LANE_ROWS; i++) {
        raw[i] = load_lane(row_byte[i], begin, t);
    }
    for (uint item = begin; item < end; item++) {
        lane_item w[LANE_ROWS];
        [[unroll]] for (uint i = 0; i < LANE_ROWS; i++) {
            w[i] = lane_words(raw[i]);
            raw[i] = load_lane(row_byte[i], min(item + 1, end - 1), t);   // the next item's, in flight
        }
        [[unroll]] for (uint grp = 0; grp < LANE_GROUPS; grp++) {
            const uint k4 = (item * LANE_ITEM_VALUES + 16 * grp) / 4;
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[CM_COLS];
            [[unroll]] for (uint j = 0; j < CM_COLS; j++) {
                const uvec2 x0 = x_real[2 * j] ? xh2[x_base[2 * j] + k4] : uvec2(0u);
                const uvec2 x1 = x_real[2 * j + 1] ? xh2[x_base[2 * j + 1] + k4] : uvec2(0u);
                b[j] = frag_b(interleave4(x0), interleave4(x1));
            }
            [[unroll]] for (uint i = 0; i < CM_ROWS; i++) {
                uvec2 e[2];
                [[unroll]] for (uint h = 0; h < 2; h++) {
                    vec2 ab;
                    const uint q = lane_quants(w[2 * i + h], grp, ab);
                    e[h] = halves4(q, f16vec2(ab.x), f16vec2(ab.y));
                }
                const coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a = frag_a(e[0], e[1]);
                [[unroll]] for (uint j = 0; j < CM_COLS; j++) {
                    sums[j * CM_ROWS + i] = coopMatMulAdd(a, b[j], sums[j * CM_ROWS + i]);
                }
            }
        }
    }

    // staging[c * 16 + r]: column-major, so lanes write consecutive rows of a column of y
    const uint staged = sg * 256;
    [[unroll]] for (uint j = 0; j < CM_COLS; j++) {
        [[unroll]] for (uint i = 0; i < CM_ROWS; i++) {
            coopMatStore(sums[j * CM_ROWS + i], staging, staged, 16, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            const uint r0 = rows0 + 16 * i, c0 = col0 + 16 * j;
            for (uint e = lane; e < 256; e += SUBGROUP) {
                store_y(r0 + e % 16, c0 + e / 16, staging[staged + e]);
            }
            subgroupBarrier();
        }
    }
}

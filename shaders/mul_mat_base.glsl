// What the mat-mat kernels (mul_mat.comp, mul_mat_coopmat.comp, mul_mmq.comp) share: the
// bindings of x (f32; with MMQ, 8-bit blocks of x8.glsl) and y, the push constants, the
// workgroup's columns and the load of 16 consecutive weights of a row. Included after dequant.glsl.
// With EXPERT_TILES (a mixture-of-experts prefill, mul_mat.comp and mul_mmq.comp) the weights are
// the 3-D expert tensor of one part (experts expert_first .. + expert_count, `rows` rows each)
// and workgroup y is tile y of moe_group.comp (up to BN slots of one expert): the workgroup's
// column c is the tile's c-th slot s, reading x column s (x_per_slot: the down product) or its
// token s / n_used, and writing y row s; an empty tile, or one whose expert lies in another part,
// does nothing. EXPERT_BIAS adds the expert's bias row ([n_expert, rows], binding 4).

#if defined(MMQ)
#include "x8.glsl"
layout(std430, binding = 1) readonly buffer X8 { ivec4 x8[]; };
#else
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
layout(std430, binding = 2) buffer Y { float y[]; };
#if defined(QKV)
// The weight is Q, K and V (or Q and K) one after the other (matmul.py's matmul_qkv): rows
// before k_first are Q's, written to y, then K's to y_k and V's to y_v.
layout(std430, binding = 3) buffer Y_K { float y_k[]; };
layout(std430, binding = 4) buffer Y_V { float y_v[]; };
#endif
#if defined(EXPERT_TILES)
// moe_group.comp's output: the slots by expert, then (expert, first, count) per tile
layout(std430, binding = 3) readonly buffer Tiles { uint tiles[]; };
#if defined(EXPERT_BIAS)
layout(std430, binding = 4) readonly buffer Bias { float bias[]; };
#endif
#endif

#include "mul_mat_push.glsl"

#if defined(EXPERT_TILES)
uint tile_word(uint i) { return tiles[p.n + 3 * gl_WorkGroupID.y + i]; }
// The workgroup's first column (columns first_col(bn) .. cols_end() - 1 are real ones).
uint first_col(uint bn) { return 0; }
uint cols_end() { return tile_word(0) - p.expert_first < p.expert_count ? tile_word(2) : 0; }
uint tile_slot(uint col) { return tiles[tile_word(1) + col]; }
uint x_col(uint col) { return p.x_per_slot != 0 ? tile_slot(col) : tile_slot(col) / p.n_used; }
uint y_col(uint col) { return tile_slot(col); }
// Row `row` of the expert in the part's weights.
uint a_row(uint row) { return (tile_word(0) - p.expert_first) * p.rows + row; }
#else
uint first_col(uint bn) { return gl_WorkGroupID.y * bn; }
uint cols_end() { return p.n; }
uint x_col(uint col) { return col; }
uint y_col(uint col) { return col; }
uint a_row(uint row) { return row; }
#endif

#if !defined(ITEMS)   // (the cooperative-matrix kernel's ITEMS load mul_mat_vec_items.glsl's items)
// Weights k .. k+15 of a row (k a multiple of 16); float rows may end within them (zeros past
// the end).
mat4 load_a16(uint part_row, uint k) {
    const uint row = a_row(part_row);
#if QUANT_K == 1
    if (k + 16 > p.ncols) {
        mat4 v = mat4(0.0);
        for (uint j = 0; k + j < p.ncols; j++) {
            v[j / 4][j % 4] = dequantize1(row * p.ncols + k + j);
        }
        return v;
    }
#endif
    return dequantize16(row * (p.ncols / QUANT_K) + k / QUANT_K, (k % QUANT_K) / 16);
}
#endif

#if !defined(MMQ)
// x[col, k .. k+3] (col: of the workgroup's columns), zeros past the end of the row or of the
// columns.
vec4 load_x4(uint col, uint k) {
    vec4 xv = vec4(0.0);
    if (col < cols_end() && k < p.ncols) {
        const uint i = x_col(col) * p.ncols + k;
        if (p.ncols % 4 == 0) {
            xv = x4[i / 4];
        } else {
            for (uint j = 0; j < 4 && k + j < p.ncols; j++) {
                xv[j] = x[i + j];
            }
        }
    }
    return xv;
}
#endif

#if defined(QKV)
#include "qkv_store.glsl"
#endif

// y[col, y_offset + row] (+)= v (+ the expert's bias), inside the part and the columns; QKV:
// the output of the row's section = v; SPLIT_K: y (or the section's output) += v atomically
// (mul_mat_coopmat.comp).
void store_y(uint row, uint col, float v) {
#if defined(QKV)
    if (row < p.rows && col < p.n) {
        store_qkv(col, p.y_offset + row, v);
    }
    return;
#endif
    if (row < p.rows && col < cols_end()) {
#if defined(EXPERT_BIAS)
        v += bias[tile_word(0) * p.rows + row];
#endif
        const uint idx = y_col(col) * p.y_stride + p.y_offset + row;
#if defined(SPLIT_K)   // workgroups of other ranges of K add to the same y
        atomicAdd(y[idx], v);
#else
        y[idx] = p.accumulate != 0 ? y[idx] + v : v;
#endif
    }
}

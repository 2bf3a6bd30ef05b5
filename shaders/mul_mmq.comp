#version 450
#include "int_dot.glsl"
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat_base.glsl"

// Matrix x matrix (prefill) with packed 8-bit integer dot products: what mul_mat.comp computes,
// over activations quantized by quantize_x8.comp (x8.glsl blocks of 32). Tiles of BM rows x BN
// columns (TILE) per workgroup of (TILE / 4)^2 threads, K in steps of one 32-value block: the
// first 2 * BM threads each load one row's 16-value slice of weight quants with its scale and
// offset (quants16), the next BN threads one column's activation block; then each thread
// accumulates 4 rows x 4 columns: per slice an exact integer dot of the quants, scaled once,
// plus the weight offset times the activation slice's sum,
//   y += a * d * (w . q) + b * d * sum(q).
// TILE 64: 256 threads, of which 192 load. With EXPERT_TILES the columns are one expert tile's
// slots (mul_mat_base.glsl), x8 quantized per row of x (token, or slot for the down product).
layout(constant_id = 1) const uint TILE = 64;
const uint BM = TILE;
const uint BN = TILE;
const uint THREADS_PER_COL = BM / 4;   // threads along a column of the tile, 4 rows each

shared ivec4 tile_q[2][BM];    // weight quants of slice s (values 16s .. 16s+15 of the block)
shared vec2 tile_ab[2][BM];    // their scale and offset
shared ivec4 tile_xq[2][BN];   // activation quants
shared vec4 tile_xd[BN];       // activation scale and slice sums (x8.glsl's ds)

void load_tiles(uint tid, uint row0, uint col0, uint k0) {
    if (tid < 2 * BM) {
        const uint s = tid % 2, row = tid / 2, k = k0 + 16 * s;
        vec2 ab = vec2(0.0);
        ivec4 q = ivec4(0);
        if (row0 + row < p.rows) {
            q = quants16(a_row(row0 + row) * (p.ncols / QUANT_K) + k / QUANT_K, (k % QUANT_K) / 16, ab);
        }
        tile_q[s][row] = q;
        tile_ab[s][row] = ab;
        return;
    }
    const uint col = tid - 2 * BM;
    if (col < BN) {
        const bool inside = col0 + col < cols_end();
        const uint nb = p.ncols / 32, c = inside ? x_col(col0 + col) : 0;
        tile_xq[0][col] = inside ? x8[x8_word(c, nb, k0 / 32, 0)] : ivec4(0);
        tile_xq[1][col] = inside ? x8[x8_word(c, nb, k0 / 32, 1)] : ivec4(0);
        tile_xd[col] = inside ? intBitsToFloat(x8[x8_word(c, nb, k0 / 32, 2)]) : vec4(0.0);
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = first_col(BN);
    if (col0 >= cols_end()) {   // an empty expert tile (mul_mat_base.glsl)
        return;
    }
    const uint tr = tid % THREADS_PER_COL, tc = tid / THREADS_PER_COL;
    mat4 acc = mat4(0.0);  // acc[j][i]: column 4 tc + j, row 4 tr + i
    for (uint k0 = 0; k0 < p.ncols; k0 += 32) {
        load_tiles(tid, row0, col0, k0);
        barrier();
        vec4 xd[4];
        for (uint j = 0; j < 4; j++) {
            xd[j] = tile_xd[4 * tc + j];
        }
        for (uint s = 0; s < 2; s++) {
            ivec4 w[4], xq[4];
            vec2 ab[4];
            for (uint i = 0; i < 4; i++) {
                w[i] = tile_q[s][4 * tr + i];
                ab[i] = tile_ab[s][4 * tr + i];
                xq[i] = tile_xq[s][4 * tc + i];
            }
            for (uint j = 0; j < 4; j++) {
                for (uint i = 0; i < 4; i++) {
                    const float dot = float(idot16(w[i], xq[j], 0));
                    acc[j][i] += ab[i].x * xd[j].x * dot + ab[i].y * xd[j][1 + s];
                }
            }
        }
        barrier();
    }
    for (uint j = 0; j < 4; j++) {
        for (uint i = 0; i < 4; i++) {
            store_y(row0 + 4 * tr + i, col0 + 4 * tc + j, acc[j][i]);
        }
    }
}

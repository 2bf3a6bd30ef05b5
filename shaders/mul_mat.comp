#version 450
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat_base.glsl"

// Matrix x matrix (prefill): y[t, y_offset + r] (+)= sum_k W[r, k] * x[t, k] for the rows of one
// part and n token columns. Tiles of BM rows x BN columns (TILE, a specialization constant from
// matmul.py) per workgroup of (TILE / 4)^2 threads, K in steps of BK through shared memory: the
// first A_LOADERS threads dequantize the BM x BK weight tile (one 16-value slice each), the
// others load the BN x BK activation tile as 4-vectors along K (neighbouring threads read
// neighbouring memory); then each thread accumulates the 4 x 4 outputs of 4 consecutive rows
// and 4 consecutive columns in fp32, from two 4-vector loads of shared memory per step of k.
// TILE 64: 256 threads, half of them loading weights. With EXPERT_TILES the columns are one
// expert tile's slots (mul_mat_base.glsl).
layout(constant_id = 1) const uint TILE = 64;
const uint BM = TILE;
const uint BN = TILE;
const uint BK = 32;
const uint A_LOADERS = BM * BK / 16;
const uint THREADS_PER_COL = BM / 4;   // threads along a column of the tile, 4 rows each

shared vec4 tile_a[BK][BM / 4];
shared vec4 tile_x[BK][BN / 4];

void load_tiles(uint tid, uint row0, uint col0, uint k0) {
    if (tid < A_LOADERS) {
        const uint slice = tid % (BK / 16), row = tid / (BK / 16), k = k0 + 16 * slice;
        const mat4 v = row0 + row < p.rows && k < p.ncols ? load_a16(row0 + row, k) : mat4(0.0);
        for (uint j = 0; j < 16; j++) {
            tile_a[16 * slice + j][row / 4][row % 4] = v[j / 4][j % 4];
        }
        return;
    }
    for (uint v = tid - A_LOADERS; v < BN * BK / 4; v += gl_WorkGroupSize.x - A_LOADERS) {
        const uint col = v / (BK / 4);
        const vec4 xv = load_x4(col0 + col, k0 + 4 * (v % (BK / 4)));
        for (uint j = 0; j < 4; j++) {
            tile_x[4 * (v % (BK / 4)) + j][col / 4][col % 4] = xv[j];
        }
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
    for (uint k0 = 0; k0 < p.ncols; k0 += BK) {
        load_tiles(tid, row0, col0, k0);
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            const vec4 a = tile_a[kk][tr], b = tile_x[kk][tc];
            acc += outerProduct(a, b);
        }
        barrier();
    }
    for (uint j = 0; j < 4; j++) {
        for (uint i = 0; i < 4; i++) {
            store_y(row0 + 4 * tr + i, col0 + 4 * tc + j, acc[j][i]);
        }
    }
}

#version 450
#include "common.glsl"
#include "dequant.glsl"

// Matrix x matrix (prefill): y[t, y_offset + r] (+)= sum_k W[r, k] * x[t, k] for the rows of one
// part and n token columns. Tiles of BM rows x BN columns (TILE, a specialization constant from
// matmul.py) per workgroup of (TILE / 4)^2 threads, K in steps of BK through shared memory: the
// first A_LOADERS threads dequantize the BM x BK weight tile (one 16-value slice each), the
// others load the BN x BK activation tile as 4-vectors along K (neighbouring threads read
// neighbouring memory); then each thread accumulates the 4 x 4 outputs of 4 consecutive rows
// and 4 consecutive columns in fp32, from two 4-vector loads of shared memory per step of k.
// TILE 64: 256 threads, half of them loading weights.
layout(constant_id = 1) const uint TILE = 64;
const uint BM = TILE;
const uint BN = TILE;
const uint BK = 32;
const uint A_LOADERS = BM * BK / 16;
const uint THREADS_PER_COL = BM / 4;   // threads along a column of the tile, 4 rows each

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

// The same block as mul_mat_vec_base.glsl's: matmul.py packs both alike.
layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint n;           // columns of x and y (tokens)
    uint y_offset;    // index in a column of y of this part's first row
    uint y_stride;    // length of a column of y: all rows of the tensor
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite
} p;

shared vec4 tile_a[BK][BM / 4];
shared vec4 tile_x[BK][BN / 4];

mat4 load_a16(uint row, uint k) {
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
        const uint col = v / (BK / 4), k = k0 + 4 * (v % (BK / 4));
        vec4 xv = vec4(0.0);
        if (col0 + col < p.n && k < p.ncols) {
            const uint i = (col0 + col) * p.ncols + k;
            if (p.ncols % 4 == 0) {
                xv = x4[i / 4];
            } else {
                for (uint j = 0; j < 4 && k + j < p.ncols; j++) {
                    xv[j] = x[i + j];
                }
            }
        }
        for (uint j = 0; j < 4; j++) {
            tile_x[4 * (v % (BK / 4)) + j][col / 4][col % 4] = xv[j];
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
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
        const uint col = col0 + 4 * tc + j;
        for (uint i = 0; i < 4; i++) {
            const uint row = row0 + 4 * tr + i;
            if (row < p.rows && col < p.n) {
                const uint idx = col * p.y_stride + p.y_offset + row;
                y[idx] = p.accumulate != 0 ? y[idx] + acc[j][i] : acc[j][i];
            }
        }
    }
}

#version 450
#include "common.glsl"
#include "dequant.glsl"

// Matrix x matrix (prefill): y[t, y_offset + r] (+)= sum_k W[r, k] * x[t, k] for the rows of one
// part and n token columns. Tiles of BM rows x BN columns per workgroup of 256 threads, K in
// steps of BK through shared memory: half the threads dequantize a BM x BK weight tile (one
// 16-value slice each), the other half load the BN x BK activation tile; then each thread
// accumulates a 4 x 4 block of outputs in fp32.
#define BM 64
#define BN 64
#define BK 32

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint n;           // token columns
    uint y_offset;    // index in a row of y of this part's first row
    uint y_stride;    // length of a row of y: all rows of the tensor
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite
} p;

shared float tile_a[BK][BM];
shared float tile_x[BK][BN];

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

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM, col0 = gl_WorkGroupID.y * BN;
    const uint tr = tid % 16, tc = tid / 16;
    const uint lt = tid % 128, lrc = lt / 2, lk = 16 * (lt % 2);
    float acc[4][4];
    for (uint i = 0; i < 4; i++) {
        for (uint j = 0; j < 4; j++) {
            acc[i][j] = 0.0;
        }
    }
    for (uint k0 = 0; k0 < p.ncols; k0 += BK) {
        const uint k = k0 + lk;
        if (tid < 128) {
            const uint row = row0 + lrc;
            const mat4 v = row < p.rows && k < p.ncols ? load_a16(row, k) : mat4(0.0);
            for (uint j = 0; j < 16; j++) {
                tile_a[lk + j][lrc] = v[j / 4][j % 4];
            }
        } else {
            const uint col = col0 + lrc;
            for (uint j = 0; j < 16; j++) {
                tile_x[lk + j][lrc] = col < p.n && k + j < p.ncols ? x[col * p.ncols + k + j] : 0.0;
            }
        }
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            float a[4], b[4];
            for (uint i = 0; i < 4; i++) {
                a[i] = tile_a[kk][tr + 16 * i];
                b[i] = tile_x[kk][tc + 16 * i];
            }
            for (uint i = 0; i < 4; i++) {
                for (uint j = 0; j < 4; j++) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        barrier();
    }
    for (uint i = 0; i < 4; i++) {
        for (uint j = 0; j < 4; j++) {
            const uint row = row0 + tr + 16 * i, col = col0 + tc + 16 * j;
            if (row < p.rows && col < p.n) {
                const uint idx = col * p.y_stride + p.y_offset + row;
                y[idx] = p.accumulate != 0 ? y[idx] + acc[i][j] : acc[i][j];
            }
        }
    }
}

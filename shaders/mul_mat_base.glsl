// What the mat-mat kernels (mul_mat.comp, mul_mat_coopmat.comp, mul_mmq.comp) share: the
// bindings of x (f32; with MMQ, 8-bit blocks of x8.glsl) and y, the push constants and the load
// of 16 consecutive weights of a row. Included after dequant.glsl.

#if defined(MMQ)
#include "x8.glsl"
layout(std430, binding = 1) readonly buffer X8 { block_x8 x8[]; };
#else
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
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

// Weights k .. k+15 of a row (k a multiple of 16); float rows may end within them (zeros past
// the end).
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

#if !defined(MMQ)
// x[col, k .. k+3], zeros past the end of the row or of the columns.
vec4 load_x4(uint col, uint k) {
    vec4 xv = vec4(0.0);
    if (col < p.n && k < p.ncols) {
        const uint i = col * p.ncols + k;
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

// y[col, y_offset + row] (+)= v, inside the part and the columns.
void store_y(uint row, uint col, float v) {
    if (row < p.rows && col < p.n) {
        const uint idx = col * p.y_stride + p.y_offset + row;
        y[idx] = p.accumulate != 0 ? y[idx] + v : v;
    }
}

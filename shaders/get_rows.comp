#version 450
#include "common.glsl"
#include "dequant.glsl"

// out[i, :] = row ids[i] of the table, dequantized to f32 (embedding lookup). One dispatch per
// part of the table: ids outside [first_row, first_row + rows) belong to another part. Values are
// multiplied by `scale` (Gemma scales its embeddings by sqrt(n_embd); 1 otherwise).
// x: 16-value slices of the row; y: the id index i.
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint ncols;
    uint first_row;
    uint rows;
    float scale;
} p;

void main() {
    const uint i = gl_WorkGroupID.y, t = gl_GlobalInvocationID.x;
    const uint row = ids[i] - p.first_row;  // wraps to a huge value below first_row
    const uint k = 16 * t;
    if (row >= p.rows || k >= p.ncols) {
        return;
    }
    const uint out0 = i * p.ncols + k;
#if QUANT_K == 1
    if (k + 16 > p.ncols) {
        for (uint j = k; j < p.ncols; j++) {
            o[i * p.ncols + j] = dequantize1(row * p.ncols + j) * p.scale;
        }
        return;
    }
#endif
    const mat4 v = dequantize16(row * (p.ncols / QUANT_K) + k / QUANT_K, (k % QUANT_K) / 16);
    for (uint c = 0; c < 4; c++) {
        for (uint j = 0; j < 4; j++) {
            o[out0 + 4 * c + j] = v[c][j] * p.scale;
        }
    }
}

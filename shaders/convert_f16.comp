#version 450
#include "common.glsl"

// x f32 [n, ncols] -> f16, each column's row padded with zeros to a multiple of 8 values: the
// input of the cooperative-matrix mat-mat kernel (mul_mat_coopmat.comp), which copies it into its
// tiles as it is. One thread per 8 values (one 16-byte store).
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer XH { uvec4 xh[]; };

layout(push_constant) uniform Push {
    uint ncols;   // K
    uint n;       // columns (tokens)
} p;

void main() {
    const uint v = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    const uint row_vectors = (p.ncols + 7) / 8;
    if (v >= p.n * row_vectors) {
        return;
    }
    const uint col = v / row_vectors, k = 8 * (v % row_vectors), i = col * p.ncols + k;
    vec4 a, b;
    if (p.ncols % 8 == 0) {
        a = x4[i / 4];
        b = x4[i / 4 + 1];
    } else {
        float e[8];
        for (uint j = 0; j < 8; j++) {
            e[j] = k + j < p.ncols ? x[i + j] : 0.0;
        }
        a = vec4(e[0], e[1], e[2], e[3]);
        b = vec4(e[4], e[5], e[6], e[7]);
    }
    xh[v] = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// Matrix x vector (decode): y[y_offset + r] (+)= sum_k W[r, k] * x[k] for the rows of one part.
// Owns bindings, push constants, the row assignment and the reduction, so a kernel writes only
// its inner loop. NUM_ROWS rows per workgroup; the threads stride over K and each keeps one
// fp32 partial sum per row, summed by subgroupAdd and then across subgroups in shared memory.
// Workgroups beyond maxComputeWorkGroupCount[0] continue in the y dimension of the dispatch.
#include "dequant.glsl"

layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(constant_id = 1) const uint NUM_ROWS = 2;

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint y_offset;    // index in y of this part's first row
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite
} p;

shared float partial[NUM_ROWS][BLOCK_SIZE];

uint first_row() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
}

// Rows past the end are computed on a clamped row (no branch in the loop) and never stored.
uint clamped_row(uint row) { return min(row, p.rows - 1); }

// x[k .. k+15], k a multiple of 16.
mat4 load_x16(uint k) {
    return mat4(x4[k / 4], x4[k / 4 + 1], x4[k / 4 + 2], x4[k / 4 + 3]);
}

float dot16(mat4 a, mat4 b) {
    return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}

void reduce_and_store(uint row0, inout float acc[NUM_ROWS]) {
    for (uint r = 0; r < NUM_ROWS; r++) {
        acc[r] = subgroupAdd(acc[r]);
    }
    if (gl_NumSubgroups > 1) {
        if (subgroupElect()) {
            for (uint r = 0; r < NUM_ROWS; r++) {
                partial[r][gl_SubgroupID] = acc[r];
            }
        }
        barrier();
        for (uint r = 0; r < NUM_ROWS; r++) {
            acc[r] = 0.0;
            for (uint i = 0; i < gl_NumSubgroups; i++) {
                acc[r] += partial[r][i];
            }
        }
    }
    if (gl_LocalInvocationID.x == 0) {
        for (uint r = 0; r < NUM_ROWS && row0 + r < p.rows; r++) {
            const uint i = p.y_offset + row0 + r;
            y[i] = p.accumulate != 0 ? y[i] + acc[r] : acc[r];
        }
    }
}

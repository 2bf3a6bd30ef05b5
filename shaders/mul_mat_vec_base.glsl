// Matrix x vector (decode), for up to NUM_COLS vectors at once (a few tokens or sequences: the
// weights are read once for all of them): y[c, y_offset + r] (+)= sum_k W[r, k] * x[c, k] for the
// rows of one part. Owns bindings, push constants, the row and column assignment and the
// reduction, so a kernel writes only its inner loop. NUM_ROWS rows per workgroup; the threads
// stride over K and each keeps one fp32 partial sum per row and column, summed by subgroupAdd and
// then across subgroups in shared memory. Workgroups beyond maxComputeWorkGroupCount[0] continue
// in the y dimension of the dispatch; column groups are the z dimension.
#include "dequant.glsl"

layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(constant_id = 1) const uint NUM_ROWS = 2;
layout(constant_id = 2) const uint NUM_COLS = 1;

layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint y_offset;    // index in y of this part's first row
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite
    uint n;           // columns of x and y
    uint y_stride;    // length of a column of y: all rows of the tensor
} p;

shared float partial[NUM_COLS * NUM_ROWS][BLOCK_SIZE];

uint first_row() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
}

// Rows past the end are computed on a clamped row (no branch in the loop) and never stored.
uint clamped_row(uint row) { return min(row, p.rows - 1); }

uint first_col() {
    return gl_WorkGroupID.z * NUM_COLS;
}

// Columns past the end are computed on a clamped column and never stored.
uint clamped_col(uint col) { return min(col, p.n - 1); }

// x[k .. k+15], k a multiple of 16 (column c starts at c * ncols).
mat4 load_x16(uint k) {
    return mat4(x4[k / 4], x4[k / 4 + 1], x4[k / 4 + 2], x4[k / 4 + 3]);
}

float dot16(mat4 a, mat4 b) {
    return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}

void reduce_and_store(uint row0, uint col0, inout float acc[NUM_COLS][NUM_ROWS]) {
    for (uint c = 0; c < NUM_COLS; c++) {
        for (uint r = 0; r < NUM_ROWS; r++) {
            acc[c][r] = subgroupAdd(acc[c][r]);
        }
    }
    if (gl_NumSubgroups > 1) {
        if (subgroupElect()) {
            for (uint c = 0; c < NUM_COLS; c++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    partial[c * NUM_ROWS + r][gl_SubgroupID] = acc[c][r];
                }
            }
        }
        barrier();
        for (uint c = 0; c < NUM_COLS; c++) {
            for (uint r = 0; r < NUM_ROWS; r++) {
                acc[c][r] = 0.0;
                for (uint i = 0; i < gl_NumSubgroups; i++) {
                    acc[c][r] += partial[c * NUM_ROWS + r][i];
                }
            }
        }
    }
    if (gl_LocalInvocationID.x == 0) {
        for (uint c = 0; c < NUM_COLS && col0 + c < p.n; c++) {
            for (uint r = 0; r < NUM_ROWS && row0 + r < p.rows; r++) {
                const uint i = (col0 + c) * p.y_stride + p.y_offset + row0 + r;
                y[i] = p.accumulate != 0 ? y[i] + acc[c][r] : acc[c][r];
            }
        }
    }
}

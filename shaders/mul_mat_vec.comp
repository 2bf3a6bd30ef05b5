#version 450
#include "common.glsl"
#include "mul_mat_vec_base.glsl"

// Inner loops. Each loads x once per step and applies it to all NUM_ROWS rows.
void main() {
    const uint row0 = first_row();
    if (row0 >= p.rows) {
        return;
    }
    float acc[NUM_ROWS];
    for (uint r = 0; r < NUM_ROWS; r++) {
        acc[r] = 0.0;
    }
    const uint tid = gl_LocalInvocationID.x;
#if QUANT_K == 1
    // Float weights: thread t takes the 4-vectors t, t + BLOCK_SIZE, ..., so that each load of
    // a subgroup reads one contiguous span; single values when rows are not 4-vector aligned.
    if (p.ncols % 4 == 0) {
        const uint n4 = p.ncols / 4;
        for (uint i = tid; i < n4; i += BLOCK_SIZE) {
            const vec4 xv = x4[i];
            for (uint r = 0; r < NUM_ROWS; r++) {
                acc[r] += dot(dequantize4(clamped_row(row0 + r) * n4 + i), xv);
            }
        }
    } else {
        for (uint k = tid; k < p.ncols; k += BLOCK_SIZE) {
            for (uint r = 0; r < NUM_ROWS; r++) {
                acc[r] += dequantize1(clamped_row(row0 + r) * p.ncols + k) * x[k];
            }
        }
    }
#else
    // Quantized weights: thread t takes the 16-value slices t, t + BLOCK_SIZE, ... of the row.
    const uint blocks_per_row = p.ncols / QUANT_K;
    for (uint t = tid; t < p.ncols / 16; t += BLOCK_SIZE) {
        const mat4 xv = load_x16(16 * t);
        const uint ib = 16 * t / QUANT_K, s = (16 * t % QUANT_K) / 16;
        for (uint r = 0; r < NUM_ROWS; r++) {
            acc[r] += dot16(dequantize16(clamped_row(row0 + r) * blocks_per_row + ib, s), xv);
        }
    }
#endif
    reduce_and_store(row0, acc);
}

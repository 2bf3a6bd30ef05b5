#version 450
#include "common.glsl"
#include "mul_mat_vec_base.glsl"

// Generic inner loop for every type: thread t takes the 16-value slices t, t + BLOCK_SIZE, ...
// of the row, loads x once per slice and applies it to all NUM_ROWS rows.
void main() {
    const uint row0 = first_row();
    if (row0 >= p.rows) {
        return;
    }
    const uint blocks_per_row = p.ncols / QUANT_K;
    float acc[NUM_ROWS];
    for (uint r = 0; r < NUM_ROWS; r++) {
        acc[r] = 0.0;
    }
    const uint slices = p.ncols / 16;
    for (uint t = gl_LocalInvocationID.x; t < slices; t += BLOCK_SIZE) {
        const mat4 xv = load_x16(16 * t);
        const uint ib = 16 * t / QUANT_K, s = (16 * t % QUANT_K) / 16;
        for (uint r = 0; r < NUM_ROWS; r++) {
            acc[r] += dot16(dequantize16(clamped_row(row0 + r) * blocks_per_row + ib, s), xv);
        }
    }
#if QUANT_K == 1
    for (uint k = 16 * slices + gl_LocalInvocationID.x; k < p.ncols; k += BLOCK_SIZE) {
        for (uint r = 0; r < NUM_ROWS; r++) {
            acc[r] += dequantize1(clamped_row(row0 + r) * p.ncols + k) * x[k];
        }
    }
#endif
    reduce_and_store(row0, acc);
}

#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Matrix x several vectors (batched decode: 2 to a few dozen token columns), the weights read
// once for all NUM_COLS (= COLS, a compile-time count) columns of the workgroup. Bindings, push
// constants, the row and column mapping and the store are mul_mat_vec_base.glsl's (with COLS).
// Each subgroup takes NUM_ROWS rows; the subgroups of a workgroup share one tile of x: the
// K_TILE values from k0 of each of its columns, staged in shared memory by all threads. Lane l
// dequantizes 16-value slice l (l + subgroup size, ...) of the tile once for each of its rows
// (and both weights under GLU) into registers, then applies it to every column, reading x from
// the tile (a column's 16 values as four vec4 laid out so that the lanes' reads of one vec4 hit
// distinct banks). The lanes' partial sums are summed by subgroupAdd: no shared reduction.
// The loops over columns, weights and rows are unrolled (COLS is compile-time, NUM_ROWS and
// the tile size are specialization constants), so acc stays in registers. K must be a multiple
// of 16 (matmul.py sends other weights to the mat-vec kernel).
#include "mul_mat_vec_base.glsl"
#if !defined(COLS)
#error "mul_mat_cols.comp needs COLS"
#endif

// 16-value slices of x per tile and column: the shared tile is NUM_COLS x TILE_SLICES x 64 bytes.
layout(constant_id = 3) const uint TILE_SLICES = 32;
// xs[(c * 4 + j) * TILE_SLICES + s]: vec4 j of slice s of column c.
shared vec4 xs[NUM_COLS * 4 * TILE_SLICES];

void main() {
    const uint row_first = first_row(), col0 = first_col();
    if (row_first >= p.rows) {
        return;   // a whole workgroup past the end (the dispatch rounds up): before any barrier
    }
    const uint row0 = row_first + gl_SubgroupID * NUM_ROWS;
    const uint lane = gl_SubgroupInvocationID, tid = gl_LocalInvocationID.x;
    const uint slices = p.ncols / 16, n4 = p.ncols / 4;
    float acc[NUM_COLS][NUM_MATS][NUM_ROWS];
    [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
        [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                acc[c][m][r] = 0.0;
            }
        }
    }
    for (uint t0 = 0; t0 < slices; t0 += TILE_SLICES) {
        barrier();   // the previous tile's reads are done
        // Consecutive threads load consecutive vec4s of x (coalesced); slices past K read as 0.
        for (uint i = tid; i < NUM_COLS * 4 * TILE_SLICES; i += BLOCK_SIZE) {
            const uint c = i / (4 * TILE_SLICES), v = i % (4 * TILE_SLICES), s = v / 4, j = v % 4;
            xs[(c * 4 + j) * TILE_SLICES + s] = t0 + s < slices ? x4[clamped_col(col0 + c) * n4 + 4 * t0 + v] : vec4(0.0);
        }
        barrier();
        for (uint s = lane; s < TILE_SLICES && t0 + s < slices; s += gl_SubgroupSize) {
            const uint t = t0 + s;
            mat4 w[NUM_MATS][NUM_ROWS];
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
#if QUANT_K == 1
                    w[m][r] = WEIGHTS(m, dequantize16, (clamped_row(row0 + r) * p.ncols + 16 * t, 0));
#else
                    const uint b = clamped_row(row0 + r) * (p.ncols / QUANT_K) + 16 * t / QUANT_K;
                    w[m][r] = WEIGHTS(m, dequantize16, (b, (16 * t % QUANT_K) / 16));
#endif
                }
            }
            [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                const uint i = c * 4 * TILE_SLICES + s;
                const mat4 xv = mat4(xs[i], xs[i + TILE_SLICES], xs[i + 2 * TILE_SLICES], xs[i + 3 * TILE_SLICES]);
                [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                        acc[c][m][r] += dot16(w[m][r], xv);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
        [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                acc[c][m][r] = subgroupAdd(acc[c][m][r]);
            }
        }
    }
    if (lane == 0) {
        const uint ncols_out = stored_cols(col0);
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                if (c < ncols_out && row0 + r < p.rows) {
                    store(out_col(col0 + c), row0 + r, epilogue(row0 + r, acc[c][0][r], acc[c][NUM_MATS - 1][r]));
                }
            }
        }
    }
}

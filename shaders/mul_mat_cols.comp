#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
// Matrix x several vectors (batched decode: 2 to a few dozen token columns), the weights read
// once for all NUM_COLS (= COLS, a compile-time count) columns of the workgroup. Bindings, push
// constants, the row and column mapping and the store are mul_mat_vec_base.glsl's (with COLS).
// The threads of a workgroup stage one tile of x in shared memory (TILE_SLICES 16-value slices
// of each of its columns), then each dequantizes a slice of a row once (of both weights under
// GLU) into registers and applies it to every column, reading x from the tile. Two layouts
// (specialization constant LANE_ROWS, mul_mat_vec_base.glsl):
// 0: each subgroup takes NUM_ROWS rows, lane l slice l of the tile; the lanes read distinct
//    vec4s of x (laid out so that they hit distinct banks) and their partial sums meet by
//    subgroupAdd. A workgroup covers few rows, so each reads x for few rows: fine for few columns.
// 1: each lane takes NUM_ROWS rows (a subgroup's lanes consecutive rows), subgroup g a contiguous
//    share of the tile's slices; all lanes read the same x (a broadcast), and the subgroups'
//    partial sums meet in shared memory (the tile's, reused). A workgroup covers subgroup-size
//    times more rows, each load of x serving all of them: for many columns, where x read per
//    workgroup would outweigh the weights.
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
    const uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID, tid = gl_LocalInvocationID.x;
    const uint slices = p.ncols / 16, n4 = p.ncols / 4;
    // Row r of this invocation is row_base + r * row_step; it takes the slices s_first,
    // s_first + s_step, ... below s_end of each tile.
    const uint row_base = LANE_ROWS != 0 ? row_first + lane : row_first + sg * NUM_ROWS;
    const uint row_step = LANE_ROWS != 0 ? gl_SubgroupSize : 1;
    const uint share = TILE_SLICES / gl_NumSubgroups;
    const uint s_first = LANE_ROWS != 0 ? sg * share : lane;
    const uint s_end = LANE_ROWS != 0 ? s_first + share : TILE_SLICES;
    const uint s_step = LANE_ROWS != 0 ? 1 : gl_SubgroupSize;
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
        for (uint s = s_first; s < s_end && t0 + s < slices; s += s_step) {
            const uint t = t0 + s;
            mat4 w[NUM_MATS][NUM_ROWS];
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    const uint row = clamped_row(row_base + r * row_step);
#if QUANT_K == 1
                    w[m][r] = WEIGHTS(m, dequantize16, (row * p.ncols + 16 * t, 0));
#else
                    w[m][r] = WEIGHTS(m, dequantize16, (row * (p.ncols / QUANT_K) + 16 * t / QUANT_K, (16 * t % QUANT_K) / 16));
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
    bool storing;
    if (LANE_ROWS != 0) {
        // Subgroup g's sums at float ((g * NUM_COLS + c) * NUM_MATS + m) * NUM_ROWS + r) * lanes
        // + lane of the tile (matmul.py keeps them within it); subgroup 0 adds them up.
        barrier();
        if (sg != 0) {
            [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                        const uint f = (((sg * NUM_COLS + c) * NUM_MATS + m) * NUM_ROWS + r) * gl_SubgroupSize + lane;
                        xs[f / 4][f % 4] = acc[c][m][r];
                    }
                }
            }
        }
        barrier();
        if (sg == 0) {
            for (uint g = 1; g < gl_NumSubgroups; g++) {
                [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                    [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                        [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                            const uint f = (((g * NUM_COLS + c) * NUM_MATS + m) * NUM_ROWS + r) * gl_SubgroupSize + lane;
                            acc[c][m][r] += xs[f / 4][f % 4];
                        }
                    }
                }
            }
        }
        storing = sg == 0;
    } else {
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    acc[c][m][r] = subgroupAdd(acc[c][m][r]);
                }
            }
        }
        storing = lane == 0;
    }
    if (storing) {
        const uint ncols_out = stored_cols(col0);
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                const uint row = row_base + r * row_step;
                if (c < ncols_out && row < p.rows) {
                    store(out_col(col0 + c), row, epilogue(row, acc[c][0][r], acc[c][NUM_MATS - 1][r]));
                }
            }
        }
    }
}

#version 450
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
// Matrix x several vectors (batched decode: 2 to a few dozen token columns), the weights read
// once for all NUM_COLS (= COLS, a compile-time count) columns of the workgroup. Bindings, push
// constants, the row and column mapping and the store are mul_mat_vec_base.glsl's (with COLS).
// The threads of a workgroup stage one tile of x in shared memory (TILE_SLICES 16-value slices
// of each of its columns), then each dequantizes a slice of a row once (of both weights under
// GLU) into registers and applies it to every column, reading x from the tile. Each subgroup
// has rows of its own; ROW_LANES (L, a specialization constant, mul_mat_vec_base.glsl) lanes
// share a row: lane group q (lanes qL .. qL + L - 1) takes NUM_ROWS rows (q, q + lanes / L, ...
// of the subgroup's), its lane j the slices j, j + L, ... of the tile, and the group's partial
// sums meet by shuffles. L = the subgroup size: a row's loads coalesce across the subgroup, a
// workgroup covers few rows (and reads x for them: fine for few columns), the lanes read
// distinct vec4s of x (laid out so that they hit distinct banks). Smaller L: loads coalesce
// over L lanes only, but a workgroup covers lanes / L times more rows, each load of x serving
// all of them (for many columns, where x read per workgroup would outweigh the weights), and a
// read of x from the tile is L distinct vec4s, broadcast to the groups.
// The loops over columns, weights and rows are unrolled (COLS is compile-time, NUM_ROWS and
// the tile size are specialization constants), so acc stays in registers. K must be a multiple
// of 16 (matmul.py sends other weights to the mat-vec kernel).
#include "mul_mat_vec_base.glsl"
#if !defined(COLS)
#error "mul_mat_cols.comp needs COLS"
#endif

// 16-value slices of x per tile and column: the shared tile is NUM_COLS x TILE_SLICES x 64 bytes.
layout(constant_id = 3) const uint TILE_SLICES = 32;
// xs[(c * 4 + e) * TILE_SLICES + s]: vec4 e of slice s of column c.
shared vec4 xs[NUM_COLS * 4 * TILE_SLICES];

void main() {
    const uint row_first = first_row(), col0 = first_col();
    if (row_first >= p.rows) {
        return;   // a whole workgroup past the end (the dispatch rounds up): before any barrier
    }
    const uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID, tid = gl_LocalInvocationID.x;
    const uint slices = p.ncols / 16, n4 = p.ncols / 4;
    // Row r of this invocation is row_base + r * groups; it takes the slices j, j + ROW_LANES, ...
    const uint groups = gl_SubgroupSize / ROW_LANES, q = lane / ROW_LANES, j = lane % ROW_LANES;
    const uint row_base = row_first + sg * NUM_ROWS * groups + q;
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
            const uint c = i / (4 * TILE_SLICES), v = i % (4 * TILE_SLICES), s = v / 4, e = v % 4;
            const vec4 value = t0 + s < slices ? x4[clamped_col(col0 + c) * n4 + 4 * t0 + v] : vec4(0.0);
            xs[(c * 4 + e) * TILE_SLICES + s] = value;
        }
        barrier();
        for (uint s = j; s < TILE_SLICES && t0 + s < slices; s += ROW_LANES) {
            const uint t = t0 + s;
            mat4 w[NUM_MATS][NUM_ROWS];
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    const uint row = clamped_row(row_base + r * groups);
#if QUANT_K == 1
                    w[m][r] = WEIGHTS(m, dequantize16, (row * p.ncols + 16 * t, 0));
#else
                    const uint b = row * (p.ncols / QUANT_K) + 16 * t / QUANT_K;
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
    for (uint d = 1; d < ROW_LANES; d *= 2) {   // the lane group's sums, in each of its lanes
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    acc[c][m][r] += subgroupShuffleXor(acc[c][m][r], d);
                }
            }
        }
    }
    if (j == 0) {
        const uint ncols_out = stored_cols(col0);
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                const uint row = row_base + r * groups;
                if (c < ncols_out && row < p.rows) {
                    store(out_col(col0 + c), row, epilogue(row, acc[c][0][r], acc[c][NUM_MATS - 1][r]));
                }
            }
        }
    }
}

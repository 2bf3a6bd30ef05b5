#version 450
#if defined(X8)
#include "int_dot.glsl"
#endif
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
#if defined(SPLIT_K)
#extension GL_EXT_shader_atomic_float : require
#endif
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
// With X8 (Q4_K, Q5_K, Q6_K: the types whose items give integer quants, mul_mat_vec_items.glsl)
// x is in 8-bit blocks (x8.glsl) and the tile is TILE_ITEMS items of each lane's row (L x
// TILE_ITEMS items of every row of the workgroup): each thread first issues the 16-byte loads of
// its items of every row and weight, then the workgroup stages the tile's blocks of x, then per
// 32-value block each thread takes its rows' integer quants once and dots them with every
// column's (packed 8-bit dot products), as the 8-bit mat-vec kernel does for one column.
// The loops over columns, weights and rows are unrolled (COLS is compile-time, NUM_ROWS and
// the tile size are specialization constants), so acc stays in registers. K must be a multiple
// of 16 (matmul.py sends other weights to the mat-vec kernel; over 8-bit x, of the item size).
#include "mul_mat_vec_base.glsl"
#if !defined(COLS)
#error "mul_mat_cols.comp needs COLS"
#endif

#if defined(SPLIT_K) && !defined(X8)
#error "mul_mat_cols.comp splits K over 8-bit x only"
#endif
#if defined(X8)
#if !defined(X8_ITEMS)
#error "mul_mat_cols.comp with X8 takes the types with 8-bit items (Q4_K, Q5_K, Q6_K)"
#endif
layout(constant_id = 3) const uint TILE_ITEMS = 2;
const uint ITEM_BLOCKS = ITEM_VALUES / 32;
const uint TILE_SPAN = ROW_LANES * TILE_ITEMS;     // items of a row per tile
const uint TILE_BLOCKS = TILE_SPAN * ITEM_BLOCKS;
// xs[((c * 3 + h) * ITEM_BLOCKS + s) * TILE_SPAN + t]: word h (x8.glsl) of block s of the tile's
// item t, column c: the lanes of a group, on consecutive items, read consecutive words.
shared ivec4 xs[NUM_COLS * 3 * TILE_BLOCKS];

ivec4 x_word(uint c, uint h, uint s, uint t) { return xs[((c * 3 + h) * ITEM_BLOCKS + s) * TILE_SPAN + t]; }
const uint X_WORDS = NUM_COLS * 3 * TILE_BLOCKS, X_EACH = (X_WORDS + BLOCK_SIZE - 1) / BLOCK_SIZE;

// The words of xs this thread stages for the tile from item i0 (of the items before `items`; past
// them 0), as xs lays them out.
void load_x_tile(out ivec4 words[X_EACH], uint i0, uint items, uint col0, uint x_blocks) {
    [[unroll]] for (uint e = 0; e < X_EACH; e++) {
        const uint i = gl_LocalInvocationID.x + e * BLOCK_SIZE;
        const uint t = i % TILE_SPAN, s = i / TILE_SPAN % ITEM_BLOCKS, h = i / TILE_BLOCKS % 3;
        const uint c = min(i / (3 * TILE_BLOCKS), NUM_COLS - 1), b = (i0 + t) * ITEM_BLOCKS + s;
        words[e] = i < X_WORDS && i0 + t < items ? x8[x8_word(clamped_col(col0 + c), x_blocks, b, h)] : ivec4(0);
    }
}
#else
// 16-value slices of x per tile and column: the shared tile is NUM_COLS x TILE_SLICES x 64 bytes.
layout(constant_id = 3) const uint TILE_SLICES = 32;
// xs[(c * 4 + e) * TILE_SLICES + s]: vec4 e of slice s of column c.
shared vec4 xs[NUM_COLS * 4 * TILE_SLICES];
#endif

void main() {
    const uint row_first = first_row(), col0 = first_col();
    if (row_first >= p.rows) {
        return;   // a whole workgroup past the end (the dispatch rounds up): before any barrier
    }
    const uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID, tid = gl_LocalInvocationID.x;
    // Row r of this invocation is row_base + r * groups; it takes the slices (X8: items) j, j + ROW_LANES, ...
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
#if defined(X8)
    const uint x_blocks = p.ncols / 32;
#if defined(SPLIT_K)
    const uint span = (p.ncols / ITEM_VALUES + gl_NumWorkGroups.z - 1) / gl_NumWorkGroups.z;
    const uint begin = gl_WorkGroupID.z * span, items = min(p.ncols / ITEM_VALUES, begin + span);
#else
    const uint begin = 0, items = p.ncols / ITEM_VALUES;   // this workgroup's items: begin .. items - 1
#endif
    ITEM_ROW_BYTES(row_byte, row_base, groups)
    // This thread's words of the tile of x (xs[tid], xs[tid + BLOCK_SIZE], ...), loaded a tile
    // ahead: the next tile's are in flight during this one's math.
    ivec4 x_next[X_EACH];
    load_x_tile(x_next, begin, items, col0, x_blocks);
    for (uint i0 = begin; i0 < items; i0 += TILE_SPAN) {
        // This tile's weights first, in flight while x is staged.
        LOAD_ITEMS(raw, TILE_ITEMS, i0 + j, ROW_LANES, items, row_byte)
        barrier();   // the previous tile's reads are done
        [[unroll]] for (uint e = 0; e < X_EACH; e++) {
            if (tid + e * BLOCK_SIZE < X_WORDS) {
                xs[tid + e * BLOCK_SIZE] = x_next[e];
            }
        }
        barrier();
        if (i0 + TILE_SPAN < items) {
            load_x_tile(x_next, i0 + TILE_SPAN, items, col0, x_blocks);
        }
        [[unroll]] for (uint u = 0; u < TILE_ITEMS; u++) {
            const uint t = u * ROW_LANES + j, item = i0 + t;
            if (item >= items) {
                break;
            }
            ALIGN_ITEMS(w, raw, u, item)
            [[unroll]] for (uint g = 0; g < ITEM_GROUPS; g += 2) {
                const uint s = group_x(item, g) / 32 - item * ITEM_BLOCKS;
                ivec4 q[NUM_MATS][NUM_ROWS][2];
                vec4 ab[NUM_MATS][NUM_ROWS];   // (a, b) of groups g and g + 1
                [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                        vec2 ab0, ab1;
                        q[m][r][0] = group_quants(w[m][r], item, g, ab0);
                        q[m][r][1] = group_quants(w[m][r], item, g + 1, ab1);
                        ab[m][r] = vec4(ab0, ab1);
                    }
                }
                [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                    const ivec4 x0 = x_word(c, 0, s, t), x1 = x_word(c, 1, s, t);
                    const vec4 ds = intBitsToFloat(x_word(c, 2, s, t));
#if defined(PAIRED_GROUPS)   // one sub-block: its two halves' sums meet as integers
                    const float sum = ds.y + ds.z;
#endif
                    [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                        [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                            const vec4 f = ab[m][r];
#if defined(PAIRED_GROUPS)
                            const float d = small_int_float(idot16(q[m][r][1], x1, idot16(q[m][r][0], x0, 0)));
                            acc[c][m][r] += ds.x * f.x * d + f.y * sum;
#else
                            const float d0 = small_int_float(idot16(q[m][r][0], x0, 0));
                            const float d1 = small_int_float(idot16(q[m][r][1], x1, 0));
                            acc[c][m][r] += ds.x * (f.x * d0 + f.z * d1) + f.y * ds.y + f.w * ds.z;
#endif
                        }
                    }
                }
            }
        }
    }
#else
    const uint slices = p.ncols / 16, n4 = p.ncols / 4;
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
#endif
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

#version 450
#if defined(X8)
#include "int_dot.glsl"
#endif
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "mul_mat_vec_base.glsl"

// Inner loops. Each dequantizes a piece of weights once and applies it to all NUM_COLS columns
// of x; each load of x serves all NUM_ROWS rows of all NUM_MATS weights.

#if defined(X8)
// Block kb of x column c against the quants q[m][r][h] of two 16-value groups (values
// 16h .. 16h+15 of the block) of each row and weight, their (a, b) in ab[m][r] (.xy, .zw): per
// group an exact integer dot, scaled once (as mul_mmq.comp): a * d * (w . q) + b * d * sum(q).
// Loaded per column, used at once: the columns' blocks are never all in registers together.
// (Reads main's col0, x_blocks and acc.)
#define X8_COLUMN_DOTS(c, kb, q, ab) { \
    const uint col_ = clamped_col(col0 + (c)); \
    const ivec4 x0_ = x8[x8_word(col_, x_blocks, kb, 0)], x1_ = x8[x8_word(col_, x_blocks, kb, 1)]; \
    const vec4 ds_ = intBitsToFloat(x8[x8_word(col_, x_blocks, kb, 2)]); \
    [[unroll]] for (uint m_ = 0; m_ < NUM_MATS; m_++) { \
        [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
            const vec4 f_ = ab[m_][r_]; \
            acc[c][m_][r_] += ds_.x * (f_.x * float(idot16(q[m_][r_][0], x0_, 0)) + f_.z * float(idot16(q[m_][r_][1], x1_, 0))) \
                              + f_.y * ds_.y + f_.w * ds_.z; \
        } \
    } \
}
#endif

void main() {
    const uint row0 = first_row(), col0 = first_col();
    if (row0 >= p.rows) {
        return;
    }
    float acc[NUM_COLS][NUM_MATS][NUM_ROWS];
    for (uint c = 0; c < NUM_COLS; c++) {
        for (uint m = 0; m < NUM_MATS; m++) {
            for (uint r = 0; r < NUM_ROWS; r++) {
                acc[c][m][r] = 0.0;
            }
        }
    }
    clear_sums();
    const uint tid = gl_LocalInvocationID.x;
#if QUANT_K == 1
    // Float weights: thread t takes the 4-vectors t, t + BLOCK_SIZE, ..., so that each load of
    // a subgroup reads one contiguous span; single values when rows are not 4-vector aligned.
    if (p.ncols % 4 == 0) {
        const uint n4 = p.ncols / 4;
        for (uint i = tid; i < n4; i += BLOCK_SIZE) {
            vec4 xv[NUM_COLS];
            for (uint c = 0; c < NUM_COLS; c++) {
                xv[c] = load_xc4(c, i);
            }
            for (uint m = 0; m < NUM_MATS; m++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    const vec4 w = WEIGHTS(m, dequantize4, (clamped_row(row0 + r) * n4 + i));
                    for (uint c = 0; c < NUM_COLS; c++) {
                        acc[c][m][r] += dot(w, xv[c]);
                    }
                }
            }
        }
    } else {
        for (uint k = tid; k < p.ncols; k += BLOCK_SIZE) {
            float xv[NUM_COLS];
            for (uint c = 0; c < NUM_COLS; c++) {
                xv[c] = load_xc1(c, k);
            }
            for (uint m = 0; m < NUM_MATS; m++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    const float w = WEIGHTS(m, dequantize1, (clamped_row(row0 + r) * p.ncols + k));
                    for (uint c = 0; c < NUM_COLS; c++) {
                        acc[c][m][r] += w * xv[c];
                    }
                }
            }
        }
    }
#elif defined(X8_ITEMS)
    // Quantized weights against 8-bit activations (x8.glsl), through the item loads below: per
    // item, all loads first; per 32-value block of x, each load of x serving all rows and
    // weights (X8_COLUMN_DOTS).
    items_setup();
    const uint items = p.ncols / ITEM_VALUES, x_blocks = p.ncols / 32;
    uint row_byte[NUM_ROWS];
    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
        row_byte[r] = clamped_row(row0 + r) * (p.ncols / QUANT_K) * BLOCK_BYTES;
    }
    for (uint i0 = tid; i0 < items; i0 += BLOCK_SIZE * UNROLL) {
        item_raw raw[UNROLL][NUM_MATS][NUM_ROWS];
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = min(i0 + u * BLOCK_SIZE, items - 1);
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    raw[u][m][r] = WEIGHTS(m, load_item, (row_byte[r], item));
                }
            }
        }
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = i0 + u * BLOCK_SIZE;
            if (item >= items) {
                break;
            }
            item_words w[NUM_MATS][NUM_ROWS];
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    w[m][r] = align_item(raw[u][m][r], item);
                }
            }
            [[unroll]] for (uint g = 0; g < ITEM_GROUPS; g += 2) {
                const uint kb = group_x(item, g) / 32;
                ivec4 q[NUM_MATS][NUM_ROWS][2];
                vec4 ab[NUM_MATS][NUM_ROWS];   // the two groups' (a, b)
                [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                        vec2 ab0, ab1;
                        q[m][r][0] = group_quants(w[m][r], item, g, ab0);
                        q[m][r][1] = group_quants(w[m][r], item, g + 1, ab1);
                        ab[m][r] = vec4(ab0, ab1);
                    }
                }
                [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                    X8_COLUMN_DOTS(c, kb, q, ab)
                }
            }
        }
    }
#elif defined(X8)
    // Quantized weights against 8-bit activations (x8.glsl blocks of 32, quantize_x8.comp): thread
    // t takes the 32-value blocks t, t + BLOCK_SIZE, ... of the row, two 16-value slices each
    // (X8_COLUMN_DOTS).
    const uint blocks_per_row = p.ncols / QUANT_K, x_blocks = p.ncols / 32;
    for (uint kb = tid; kb < x_blocks; kb += BLOCK_SIZE) {
        const uint ib = 32 * kb / QUANT_K, s = (32 * kb % QUANT_K) / 16;
        ivec4 q[NUM_MATS][NUM_ROWS][2];
        vec4 ab[NUM_MATS][NUM_ROWS];
        [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                const uint b = clamped_row(row0 + r) * blocks_per_row + ib;
                vec2 ab0, ab1;
                q[m][r][0] = WEIGHTS(m, quants16, (b, s, ab0));
                q[m][r][1] = WEIGHTS(m, quants16, (b, s + 1, ab1));
                ab[m][r] = vec4(ab0, ab1);
            }
        }
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            X8_COLUMN_DOTS(c, kb, q, ab)
        }
    }
#elif defined(MAT_VEC_ITEMS)
    // Quantized weights: thread t takes the items t, t + BLOCK_SIZE, ... of each row, UNROLL of
    // them at a time: all their loads for every row and weight first, then the math, each load
    // of x (a 16-value group and its sum) serving all rows and weights.
    items_setup();
    const uint items = p.ncols / ITEM_VALUES;
    uint row_byte[NUM_ROWS];
    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
        row_byte[r] = clamped_row(row0 + r) * (p.ncols / QUANT_K) * BLOCK_BYTES;
    }
    for (uint i0 = tid; i0 < items; i0 += BLOCK_SIZE * UNROLL) {
        item_raw raw[UNROLL][NUM_MATS][NUM_ROWS];
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = min(i0 + u * BLOCK_SIZE, items - 1);
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    raw[u][m][r] = WEIGHTS(m, load_item, (row_byte[r], item));
                }
            }
        }
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = i0 + u * BLOCK_SIZE;
            if (item >= items) {
                break;
            }
            item_words w[NUM_MATS][NUM_ROWS];
            [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                    w[m][r] = align_item(raw[u][m][r], item);
                }
            }
            // Groups one by one with a literal g (a loop would leave g a variable in the SPIR-V:
            // the value-building shifts and word indices are constants only this way).
#define GROUP(g) \
            [[unroll]] for (uint c = 0; c < NUM_COLS; c++) { \
                const mat4 xv = load_xc16(c, group_x(item, g)); \
                const float sx = sum16(xv); \
                [[unroll]] for (uint m = 0; m < NUM_MATS; m++) { \
                    [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) { \
                        acc[c][m][r] += group_dot(w[m][r], item, g, xv, sx); \
                    } \
                } \
            }
            GROUP(0)
            GROUP(1)
#if ITEM_GROUPS > 2
            GROUP(2)
            GROUP(3)
#endif
#if ITEM_GROUPS > 4
            GROUP(4)
            GROUP(5)
            GROUP(6)
            GROUP(7)
#endif
#undef GROUP
        }
    }
#else
    // Quantized weights: thread t takes the 16-value slices t, t + BLOCK_SIZE, ... of the row.
    const uint blocks_per_row = p.ncols / QUANT_K;
    // Columns outermost, so that each invocation loads each value of x once (the compiler may
    // keep the dequantized weights of one column for the next).
    for (uint t = tid; t < p.ncols / 16; t += BLOCK_SIZE) {
        const uint ib = 16 * t / QUANT_K, s = (16 * t % QUANT_K) / 16;
        for (uint c = 0; c < NUM_COLS; c++) {
            const mat4 xv = load_xc16(c, 16 * t);
            for (uint m = 0; m < NUM_MATS; m++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    const uint b = clamped_row(row0 + r) * blocks_per_row + ib;
                    acc[c][m][r] += dot16(WEIGHTS(m, dequantize16, (b, s)), xv);
                }
            }
        }
    }
#endif
    reduce_and_store(row0, col0, acc);
}

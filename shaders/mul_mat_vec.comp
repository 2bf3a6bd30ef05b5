#version 450
#if defined(X8)
#include "int_dot.glsl"
#endif
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "mul_mat_vec_base.glsl"

#if defined(BLOCKS_OUT)
// A one-column, one-part product over rows of a multiple of 32 that also writes its output in
// x8.glsl's 8-bit blocks: the last of a 32-row block's workgroups to store its rows (a counter per
// block, counted once its stores are visible, left at 0) reads the block back and quantizes it
// with 8 invocations, as quantize_x8.comp would: that dispatch and its barrier are gone.
// WORKGROUP_ROWS divides 32, or is a multiple of it: then each workgroup holds whole blocks and
// quantizes them itself after a barrier, with no counter (its atomic round trip at the end of
// every workgroup: on an H200 the 32B's gate+up took 63.0 us counted, 52.5 in whole blocks),
// reading them from shared memory (mul_mat_vec_base.glsl's stored_sh): no fence on its stores to
// y. The fused gate+up's output so becomes the 8-bit down product's input. With RMS_BLOCKS (a
// residual product, y the hidden state x it adds to) the blocks are the next RMSNorm's input
// instead: x times the norm weight, with the block's sum of x^2 as s (x8.glsl), which the
// products over them (X8_RMS) scale by; the norm's dispatch and its barrier are gone.
// Bindings after y: the blocks, the counters, with RMS_BLOCKS the norm weight.
layout(std430, binding = NUM_MATS + 1) coherent buffer Y4 { vec4 y4[]; };
layout(std430, binding = NUM_MATS + 2) writeonly buffer Q8 { uint q8[]; };
layout(std430, binding = NUM_MATS + 3) coherent buffer Done { uint done[]; };
#if defined(RMS_BLOCKS)
layout(std430, binding = NUM_MATS + 4) readonly buffer NormW4 { vec4 norm_w4[]; };
#endif
#include "x8_store.glsl"
shared bool last_sh;

void quantize_when_last(uint row0) {
    const uint tid = gl_LocalInvocationID.x, block = row0 / 32;
    if (WORKGROUP_ROWS < 32) {
        // every lane group's stored rows visible (its first invocation stored them) before the
        // workgroup counts them done
        memoryBarrierBuffer();
    }
    barrier();
    if (WORKGROUP_ROWS < 32) {
        if (tid == 0) {
            last_sh = atomicAdd(done[block], 1u) == 32 / WORKGROUP_ROWS - 1;
        }
        barrier();
        if (!last_sh) {
            return;
        }
        memoryBarrierBuffer();
    }
    // 8 lanes a block (of one subgroup): its 8 4-vectors
    const uint b = block + tid / 8;
    if (tid < 8 * max(1, WORKGROUP_ROWS / 32) && b < p.rows / 32) {
        const uint i4 = 8 * b + tid % 8;
        vec4 v;
        if (WORKGROUP_ROWS < 32) {
            v = y4[i4];
        } else {
            const uint j = 4 * i4 - row0;
            v = vec4(stored_sh[j], stored_sh[j + 1], stored_sh[j + 2], stored_sh[j + 3]);
        }
#if defined(RMS_BLOCKS)
        float sq = dot(v, v);
        sq += subgroupShuffleXor(sq, 1);
        sq += subgroupShuffleXor(sq, 2);
        sq += subgroupShuffleXor(sq, 4);
        store_x8(i4, v * norm_w4[i4], p.rows, sq);
#else
        store_x8(i4, v, p.rows, 0.0);
#endif
    }
    if (WORKGROUP_ROWS < 32 && tid == 0) {
        done[block] = 0u;
    }
}
#endif

// Inner loops. Each dequantizes a piece of weights once and applies it to all NUM_COLS columns
// of x; each load of x serves all NUM_ROWS rows of all NUM_MATS weights.

void main() {
    const uint row0 = first_row(), col0 = first_col();
    if (workgroup_row() >= p.rows) {   // uniform: a lane group past the end computes a clamped row
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
    const uint tid = row_lane();   // the lane groups stride over K
#if QUANT_K == 1
    // Float weights: thread t takes the 4-vectors t, t + LANES, ..., so that each load of
    // a subgroup reads one contiguous span; single values when rows are not 4-vector aligned.
    if (p.ncols % 4 == 0) {
        const uint n4 = p.ncols / 4;
        for (uint i = tid; i < n4; i += LANES) {
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
        for (uint k = tid; k < p.ncols; k += LANES) {
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
    // weights, an exact integer dot of each 16-value group's quants with the activations', scaled
    // once (as mul_mmq.comp): a * d * (w . q) + b * d * sum(q).
    const uint items = p.ncols / ITEM_VALUES, x_blocks = p.ncols / 32;
    ITEM_ROW_BYTES(row_byte, row0, 1)
    for (uint i0 = tid; i0 < items; i0 += LANES * UNROLL) {
        LOAD_ITEMS(raw, UNROLL, i0, LANES, items, row_byte)
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = i0 + u * LANES;
            if (item >= items) {
                break;
            }
            ALIGN_ITEMS(w, raw, u, item)
            [[unroll]] for (uint g = 0; g < ITEM_GROUPS; g += 2) {
                const uint kb = group_x(item, g) / 32;
                [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                    const uint col = clamped_col(col0 + c);
                    const ivec4 x0 = x8[x8_word(col, x_blocks, kb, 0)], x1 = x8[x8_word(col, x_blocks, kb, 1)];
                    const vec4 ds = intBitsToFloat(x8[x8_word(col, x_blocks, kb, 2)]);
#if defined(X8_RMS)
                    sumsq[c] += ds.w;
#endif
                    [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
                        [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                            vec2 ab0, ab1;
                            const ivec4 q0 = group_quants(w[m][r], item, g, ab0), q1 = group_quants(w[m][r], item, g + 1, ab1);
                            acc[c][m][r] += ds.x * (ab0.x * float(idot16(q0, x0, 0)) + ab1.x * float(idot16(q1, x1, 0)))
                                            + ab0.y * ds.y + ab1.y * ds.z;
                        }
                    }
                }
            }
        }
    }
#elif defined(X8)
    // Quantized weights against 8-bit activations (x8.glsl blocks of 32, quantize_x8.comp): thread
    // t takes the 32-value blocks t, t + LANES, ... of the row; per 16-value slice an exact
    // integer dot of the weight's quants with the activations', scaled once (as mul_mmq.comp):
    //   a * d * (w . q) + b * d * sum(q).
    const uint blocks_per_row = p.ncols / QUANT_K, x_blocks = p.ncols / 32;
    for (uint kb = tid; kb < x_blocks; kb += LANES) {
        const uint ib = 32 * kb / QUANT_K, s = (32 * kb % QUANT_K) / 16;
        ivec4 xq[NUM_COLS][2];
        vec4 xd[NUM_COLS];
        [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
            const uint col = clamped_col(col0 + c);
            xq[c][0] = x8[x8_word(col, x_blocks, kb, 0)];
            xq[c][1] = x8[x8_word(col, x_blocks, kb, 1)];
            xd[c] = intBitsToFloat(x8[x8_word(col, x_blocks, kb, 2)]);
#if defined(X8_RMS)
            sumsq[c] += xd[c].w;
#endif
        }
        [[unroll]] for (uint m = 0; m < NUM_MATS; m++) {
            [[unroll]] for (uint r = 0; r < NUM_ROWS; r++) {
                const uint b = clamped_row(row0 + r) * blocks_per_row + ib;
                vec2 ab0, ab1;
                const ivec4 q0 = WEIGHTS(m, quants16, (b, s, ab0)), q1 = WEIGHTS(m, quants16, (b, s + 1, ab1));
                [[unroll]] for (uint c = 0; c < NUM_COLS; c++) {
                    const vec4 ds = xd[c];
                    acc[c][m][r] += ds.x * (ab0.x * float(idot16(q0, xq[c][0], 0)) + ab1.x * float(idot16(q1, xq[c][1], 0)))
                                    + ab0.y * ds.y + ab1.y * ds.z;
                }
            }
        }
    }
#elif defined(MAT_VEC_ITEMS)
    // Quantized weights: thread t takes the items t, t + LANES, ... of each row, UNROLL of
    // them at a time: all their loads for every row and weight first, then the math, each load
    // of x (a 16-value group and its sum) serving all rows and weights.
    const uint items = p.ncols / ITEM_VALUES;
    ITEM_ROW_BYTES(row_byte, row0, 1)
    for (uint i0 = tid; i0 < items; i0 += LANES * UNROLL) {
        LOAD_ITEMS(raw, UNROLL, i0, LANES, items, row_byte)
        [[unroll]] for (uint u = 0; u < UNROLL; u++) {
            const uint item = i0 + u * LANES;
            if (item >= items) {
                break;
            }
            ALIGN_ITEMS(w, raw, u, item)
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
    // Quantized weights: thread t takes the 16-value slices t, t + LANES, ... of the row.
    const uint blocks_per_row = p.ncols / QUANT_K;
    // Columns outermost, so that each invocation loads each value of x once (the compiler may
    // keep the dequantized weights of one column for the next).
    for (uint t = tid; t < p.ncols / 16; t += LANES) {
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
#if defined(BLOCKS_OUT)
    quantize_when_last(workgroup_row());
#endif
}

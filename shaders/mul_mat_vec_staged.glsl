// Q6_K weights for the one-column mat-vec kernel over 8-bit x (mul_mat_vec.comp's X8_STAGED),
// read through shared memory. A Q6_K block is 210 bytes, so blocks are only 2-byte aligned: with
// a lane on each item (mul_mat_vec_items.glsl), a subgroup's 16-byte loads fall 105 bytes apart
// (about 26 cache lines per load instruction) and aligning them in registers costs about 170
// instructions per 128 values. Here each lane group copies STAGE_BLOCKS blocks of each of its rows
// (of each weight) at a time into its own span of shared memory, lane j the 16-byte vectors j,
// j + LANES, ... covering them: every load instruction of a subgroup reads one contiguous run. The
// loads of the next spans are issued before the math on these.
// Then lane j takes the 32-value pieces j, j + LANES, ... of the spans. Piece p = 4n + 2h + k of a
// block (ggml's dequantize_row_q6_K: half n, quarters t = h and h + 2, values 16k .. 16k + 15 of a
// quarter) is the ql vector at byte 16p (low nibbles quarter h, high nibbles quarter h + 2) with
// the qh vector at 128 + 32n + 16k (bits 2t .. 2t + 1 of each byte) and the scales 8n + 2t + k:
// two 16-value groups, each an exact integer dot with one half of an 8-bit block of x.
// Uses from mul_mat_vec_base.glsl: BLOCK_SIZE, LANES, NUM_MATS, NUM_ROWS, WEIGHTS.
#define BLOCK_BYTES 210
layout(std430, binding = 0) readonly buffer A4 { uvec4 data_u4[]; };
#if defined(GLU)
layout(std430, binding = 1) readonly buffer A4_UP { uvec4 data_u4_up[]; };
#endif

// Spans per workgroup (a lane group's rows of each weight), and blocks per span: as many (up to
// 16) as keep the spans within STAGE_BUDGET bytes of shared memory and each thread's loads in
// flight within 16 vectors. A span of B blocks starting m < 16 bytes into a vector covers at most
// (210 B + 29) / 16 vectors.
const uint STAGE_BUDGET = 16384;
const uint STAGE_SPANS = (BLOCK_SIZE / LANES) * NUM_MATS * NUM_ROWS;
const uint SPAN_ROOM = STAGE_BUDGET / STAGE_SPANS;
const uint BLOCKS_BY_SHARED = (SPAN_ROOM > 29 ? SPAN_ROOM - 29 : 0) / BLOCK_BYTES;
const uint LOADS_ROOM = NUM_MATS * NUM_ROWS >= 16 ? 1 : 16 / (NUM_MATS * NUM_ROWS);
const uint BLOCKS_BY_LOADS = (16 * LANES * LOADS_ROOM - 29) / BLOCK_BYTES;
const uint STAGE_FIT = BLOCKS_BY_SHARED < BLOCKS_BY_LOADS ? BLOCKS_BY_SHARED : BLOCKS_BY_LOADS;
const uint STAGE_BLOCKS = STAGE_FIT < 1 ? 1 : (STAGE_FIT > 16 ? 16 : STAGE_FIT);
const uint STAGE_VECTORS = (STAGE_BLOCKS * BLOCK_BYTES + 29) / 16;
const uint STAGE_LOADS = (STAGE_VECTORS + LANES - 1) / LANES;   // per thread and span

shared uvec4 stage[STAGE_SPANS * STAGE_VECTORS];

// Vector v of binding 0 (stage_vector_up: binding 1), clamped to the buffer: the vectors past a
// part's end that a span covers are loaded from wherever and never used.
uvec4 stage_vector(uint v) { return data_u4[min(v, uint(data_u4.length()) - 1)]; }
#if defined(GLU)
uvec4 stage_vector_up(uint v) { return data_u4_up[min(v, uint(data_u4_up.length()) - 1)]; }
#endif

// The first vector of span (m, r) of this lane group in `stage`.
uint span_base(uint m, uint r) {
    return ((gl_LocalInvocationID.x / LANES * NUM_MATS + m) * NUM_ROWS + r) * STAGE_VECTORS;
}

// Word w of the span from vector `base`.
uint span_word(uint base, uint w) { return stage[base + w / 4][w % 4]; }

// The 16 bytes from the even byte `at` of the span: five words, each output word shifted by 16
// bits when `at` is 2 bytes into a word (selects, not a branch: neighbouring blocks differ).
uvec4 span_vector(uint base, uint at) {
    const uint w = at / 4;
    const uvec4 lo = uvec4(span_word(base, w), span_word(base, w + 1), span_word(base, w + 2), span_word(base, w + 3));
    const uvec4 hi = uvec4(lo.yzw, span_word(base, w + 4));
    return (at & 2u) == 0 ? lo : (lo >> 16) | (hi << 16);
}

// The signed byte at byte `at` of the span.
float span_scale(uint base, uint at) {
    return float(bitfieldExtract(int(span_word(base, at / 4)), int(8 * (at % 4)), 8));
}

// Piece `piece` of the block at byte `at` of the span from `base` (an even byte) dotted with x:
// x0 and x1 are the quants of x over quarter h's and quarter h + 2's 16 values, ds0 and ds1
// their blocks' ds (x8.glsl). sum w x = d * sc * (d_x * (q . q_x) - 32 * d_x * sum(q_x)).
float piece_dot(uint base, uint at, uint piece, ivec4 x0, vec4 ds0, ivec4 x1, vec4 ds1) {
    const uint n = piece >> 2, h = (piece >> 1) & 1u, k = piece & 1u;
    const uvec4 ql = span_vector(base, at + 16 * piece), qh = span_vector(base, at + 128 + 32 * n + 16 * k);
    const uint sc = at + 192 + 8 * n + 2 * h + k, dw = at + 208;
    const float d = unpackHalf2x16(span_word(base, dw / 4) >> (8 * (dw & 2u))).x;
    const ivec4 q0 = ivec4((ql & 0x0F0F0F0Fu) | ((qh << (4 - 2 * h)) & 0x30303030u));
    const ivec4 q1 = ivec4(((ql >> 4) & 0x0F0F0F0Fu) | ((qh >> (2 * h)) & 0x30303030u));
    const float sx0 = k == 0 ? ds0.y : ds0.z, sx1 = k == 0 ? ds1.y : ds1.z;
    return d * (span_scale(base, sc) * (ds0.x * float(idot16(q0, x0, 0)) - 32.0 * sx0)
                + span_scale(base, sc + 4) * (ds1.x * float(idot16(q1, x1, 0)) - 32.0 * sx1));
}

// The loads of the spans from block b0 of every row (at byte row_byte[r] of the part) and
// weight, before any math: vector v of span (m, r) in raw[v / LANES][m][r], lane v % LANES.
#define LOAD_SPANS(raw, row_byte, b0) \
    [[unroll]] for (uint i_ = 0; i_ < STAGE_LOADS; i_++) { \
        [[unroll]] for (uint m_ = 0; m_ < NUM_MATS; m_++) { \
            [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
                const uint v_ = (row_byte[r_] + (b0) * BLOCK_BYTES) / 16 + i_ * LANES + row_lane(); \
                raw[i_][m_][r_] = WEIGHTS(m_, stage_vector, (v_)); \
            } \
        } \
    }

#define STORE_SPANS(raw) \
    [[unroll]] for (uint i_ = 0; i_ < STAGE_LOADS; i_++) { \
        const uint v_ = i_ * LANES + row_lane(); \
        if (v_ < STAGE_VECTORS) { \
            [[unroll]] for (uint m_ = 0; m_ < NUM_MATS; m_++) { \
                [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
                    stage[span_base(m_, r_) + v_] = raw[i_][m_][r_]; \
                } \
            } \
        } \
    }

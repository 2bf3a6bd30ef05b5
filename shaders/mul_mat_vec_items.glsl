// Quantized weights for the mat-vec kernel (mul_mat_vec.comp), one section per DATA_A_* type that
// takes these loops (mul_mat_vec_base.glsl says which).
// A row is cut into items: a block, or a part of a block that has its own scales. A thread loads
// its items with 16-byte loads of a uvec4 view of the weights (blocks that are not 16-byte
// aligned are fetched as the aligned vectors covering them and shifted into place in registers),
// loads several items before any math (bytes in flight), and decodes scales once per item.
// Each item is a few groups of 16 values; a group's values are an affine function of one
// number f per value, w = a * f + b with f = 1 + q / 2^bits built by placing the quant bits q in
// the mantissa of 1.0 (a shift and a mask per value, no conversion instruction), so that
//   sum_i w_i x_i = a * dot(f, x) + b * sum(x)
// costs one fma per value and weight row, and sum(x) is shared by all rows. Types whose values
// are centred on an offset (Q4_0's q - 8, Q3_K's q - 4) subtract it from f first, exactly
// (f and the offset within a factor 2 of each other): a * dot(f, x) - a * offset * sum(x) would
// cancel most of its bits. MXFP4's values are not affine: its nibbles are read as f16s times the scale.
// Per type:
//   BLOCK_BYTES, ITEM_VALUES (values per item), ITEM_GROUPS (16-value groups per item),
//   ITEM_ALIGN (the blocks' byte alignment), ITEM_RAW_WORDS (32-bit words an item loads)
//   item_raw load_item(uint row_byte, uint item)    the loads (load_item_up: binding 1)
//   item_words align_item(item_raw r, uint item)    the words in place, scales decoded
//   uint group_x(uint item, uint g)                 index in the row of group g's first value
//   float group_dot(item_words w, uint item, uint g, mat4 x, float sx)
//                                                   sum of w_i x_i over the group; sx = sum of x_i
// and, for the kernel over 8-bit x (X8_ITEMS: the K-quants),
//   ivec4 group_quants(item_words w, uint item, uint g, out vec2 ab)
//                                                   the group's quants as signed bytes (as
//                                                   dequant.glsl's quants16), w_i = ab.x * q_i + ab.y
//   PAIRED_GROUPS (defined where groups 2k and 2k + 1 always have the same ab: one 32-value block)
// and, for a kernel whose lanes each take one word c of every group's quants (Q4_K, Q5_K:
// lane_items.glsl, mul_mat_coopmat_frag.comp),
//   item_words lane_word(item_words w, uint c)      w with word c of every group in word 0's
//                                                   place: group_quants(...).x is then word c
// Layouts follow ggml's dequantize_row_* (as dequant.glsl, which the other kernels use).
// A kernel over two weights (GLU) includes this file again with ITEMS_UP defined: the loaders
// over binding 1, named *_up.
#if !defined(ITEMS_UP)
#include "types.glsl"

layout(std430, binding = 0) readonly buffer A4 { uvec4 data_u4[]; };

#include "item_bits.glsl"

#if defined(DATA_A_Q4_0)
// 18 bytes: f16 d, 16 bytes of nibbles; value j < 16 the low nibble of byte j, j + 16 its high
// nibble: d * (q - 8).
#define BLOCK_BYTES 18
#define ITEM_VALUES 32
#define ITEM_GROUPS 2
#define ITEM_ALIGN 2
#define ITEM_RAW_WORDS 12
struct item_raw { uvec4 v[3]; uint m; };
struct item_words { uvec4 q; float d; };

item_words align_item(item_raw r, uint item) {
    uint w[5];
    ALIGN_SPAN(w, 5, r.v, 3, r.m)
    item_words o;
    o.q = uvec4(HALF_SHIFTED(w, 0), HALF_SHIFTED(w, 1), HALF_SHIFTED(w, 2), HALF_SHIFTED(w, 3));
    o.d = unpackHalf2x16(w[0]).x;
    return o;
}

uint group_x(uint item, uint g) { return 32 * item + 16 * g; }

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    return 16.0 * w.d * dot16(f16(w.q, int(4 * g), 4, 1.5), x);
}

#elif defined(DATA_A_Q4_1)
// 20 bytes: f16 d and m, 16 bytes of nibbles as Q4_0: d * q + m.
#define BLOCK_BYTES 20
#define ITEM_VALUES 32
#define ITEM_GROUPS 2
#define ITEM_ALIGN 4
#define ITEM_RAW_WORDS 8
struct item_raw { uvec4 v[2]; uint m; };
struct item_words { uvec4 q; vec2 dm; };

item_words align_item(item_raw r, uint item) {
    uint w[5];
    ALIGN_SPAN(w, 5, r.v, 2, r.m)
    item_words o;
    o.q = uvec4(w[1], w[2], w[3], w[4]);
    o.dm = unpackHalf2x16(w[0]);
    return o;
}

uint group_x(uint item, uint g) { return 32 * item + 16 * g; }

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    return 16.0 * w.dm.x * dot16(f16(w.q, int(4 * g), 4, 0.0), x) + (w.dm.y - 16.0 * w.dm.x) * sx;
}

#elif defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
// Q5_0, 22 bytes: f16 d, 32 bits qh, 16 bytes of nibbles: d * (q - 16). Q5_1, 24 bytes: f16 d
// and m, qh, nibbles: d * q + m. Q4_0's nibbles plus bit j of qh as the fifth bit of value j.
#if defined(DATA_A_Q5_0)
#define BLOCK_BYTES 22
#define ITEM_ALIGN 2
#define SPAN_VECTORS 3
#else
#define BLOCK_BYTES 24
#define ITEM_ALIGN 8
#define SPAN_VECTORS 2
#endif
#define ITEM_VALUES 32
#define ITEM_GROUPS 2
#define ITEM_RAW_WORDS (4 * SPAN_VECTORS)
struct item_raw { uvec4 v[SPAN_VECTORS]; uint m; };
struct item_words { uvec4 q; uint qh; vec2 dm; };

item_words align_item(item_raw r, uint item) {
    uint w[6];
    ALIGN_SPAN(w, 6, r.v, SPAN_VECTORS, r.m)
    item_words o;
#if defined(DATA_A_Q5_0)
    o.q = uvec4(HALF_SHIFTED(w, 1), HALF_SHIFTED(w, 2), HALF_SHIFTED(w, 3), HALF_SHIFTED(w, 4));
    o.qh = HALF_SHIFTED(w, 0);
    o.dm = vec2(unpackHalf2x16(w[0]).x, 0.0);
#else
    o.q = uvec4(w[2], w[3], w[4], w[5]);
    o.qh = w[1];
    o.dm = unpackHalf2x16(w[0]);
#endif
    return o;
}

uint group_x(uint item, uint g) { return 32 * item + 16 * g; }

// f = 1 + q / 32 with the nibble and the qh bit placed separately into the mantissa.
float q5_f(uint q, uint qh, int pos, int hpos) {
    const uint lo = (pos >= 18 ? q >> (pos - 18) : q << (18 - pos)) & 0x003C0000u;
    const uint hi = (hpos >= 22 ? qh >> (hpos - 22) : qh << (22 - hpos)) & 0x00400000u;
    return uintBitsToFloat(lo | hi | 0x3F800000u);
}

#define Q5_COLUMN(c) vec4(q5_f(w.q[c], w.qh, int(4 * g), int(16 * g + 4 * c)), \
                          q5_f(w.q[c], w.qh, int(8 + 4 * g), int(16 * g + 4 * c + 1)), \
                          q5_f(w.q[c], w.qh, int(16 + 4 * g), int(16 * g + 4 * c + 2)), \
                          q5_f(w.q[c], w.qh, int(24 + 4 * g), int(16 * g + 4 * c + 3)))
float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    const mat4 f = COLUMNS(Q5_COLUMN);
#if defined(DATA_A_Q5_0)
    return 32.0 * w.dm.x * dot16(f - mat4(vec4(1.5), vec4(1.5), vec4(1.5), vec4(1.5)), x);
#else
    return 32.0 * w.dm.x * dot16(f, x) + (w.dm.y - 32.0 * w.dm.x) * sx;
#endif
}

#elif defined(DATA_A_MXFP4)
// 17 bytes: e8m0 exponent e, 16 bytes of e2m1 nibbles (low: values 0..15, high: 16..31), value
// 2^(e - 127) times the nibble's e2m1 number (sign, 2-bit exponent, 1-bit mantissa). Those bits
// placed in an f16 (sign at 15, exponent and mantissa at 9 .. 11) make that number times 2^-14
// exactly (exponent 0 the f16 subnormals, as e2m1's), so two nibbles become a packed f16 pair in
// three bit operations and unpackHalf2x16: no table. (H100, `vkllm bench kernels --tuned`, % of
// the measured read: 14336x4096 35.8, 4096x14336 32.8, where a table in shared memory gave 30.5
// and 30.0 in an earlier run.)
#define BLOCK_BYTES 17
#define ITEM_VALUES 32
#define ITEM_GROUPS 2
#define ITEM_ALIGN 1
#define ITEM_RAW_WORDS 12
struct item_raw { uvec4 v[3]; uint m; };
struct item_words { uvec4 q; float d; };

item_words align_item(item_raw r, uint item) {
    uint w[5];
    ALIGN_SPAN(w, 5, r.v, 3, r.m)
    item_words o;
    [[unroll]] for (uint c = 0; c < 4; c++) {
        o.q[c] = (w[c] >> 8) | (w[c + 1] << 24);
    }
    o.d = exp2(float(w[0] & 255u) - 127.0);
    return o;
}

uint group_x(uint item, uint g) { return 32 * item + 16 * g; }

// The nibbles at bit pos and pos + 16 of w as an f16 pair (pos < 16: a nibble of byte 0 or 1).
vec2 e2m1_pair(uint w, int pos) {
    const uint mag = (pos <= 9 ? w << (9 - pos) : w >> (pos - 9)) & 0x0E000E00u;
    const uint sign = (pos <= 12 ? w << (12 - pos) : w >> (pos - 12)) & 0x80008000u;
    return unpackHalf2x16(mag | sign);
}

// Values 4c .. 4c + 3 of group g: nibble g of bytes 0 and 2 (one pair), 1 and 3 (the other).
#define MXFP4_COLUMN(c) e2m1_column(w.q[c], int(4 * g))
vec4 e2m1_column(uint w, int pos) {
    const vec2 even = e2m1_pair(w, pos), odd = e2m1_pair(w, pos + 8);
    return vec4(even.x, odd.x, even.y, odd.y);
}

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    return w.d * (16384.0 * dot16(COLUMNS(MXFP4_COLUMN), x));
}

#elif defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
// Q4_K, 144 bytes = 9 vectors: f16 d and dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
// nibbles. Q5_K, 176 bytes = 11 vectors: the same with 32 bytes of fifth bits before the nibbles.
// An item is one 64-value chunk j (qs vectors 2j and 2j + 1): low nibbles are sub-block 2j, high
// nibbles sub-block 2j + 1 (Q5_K's fifth bits: bits 2j and 2j + 1 of qh byte l): d * sc * q - dmin * m.
#if defined(DATA_A_Q4_K)
#define BLOCK_BYTES 144
#define QS_VECTOR 1
#define Q_BITS 4
#else
#define BLOCK_BYTES 176
#define QS_VECTOR 3
#define Q_BITS 5
#endif
#define ITEM_VALUES 64
#define ITEM_GROUPS 4
#define ITEM_ALIGN 16
#define PAIRED_GROUPS   // groups 2k and 2k + 1 are one sub-block: the same a and b
#if defined(DATA_A_Q4_K)
#define ITEM_RAW_WORDS 12
struct item_raw { uvec4 head; uvec4 qs[2]; };
#else
#define ITEM_RAW_WORDS 20
struct item_raw { uvec4 head; uvec4 qs[2]; uvec4 qh[2]; };
#endif
// ab: a and b of sub-blocks 2j and 2j + 1.
struct item_words { item_raw r; vec4 ab; };

// 6-bit scale and min of sub-block j (ggml's get_scale_min_k4) from the three scale words.
vec2 scale_min_k4(uvec3 s, uint j) {
    const uint sh = 8 * (j & 3u);
    const uint b0 = s.x >> sh, b1 = s.y >> sh, b2 = s.z >> sh;
    return j < 4 ? vec2(b0 & 63u, b1 & 63u)
                 : vec2((b2 & 15u) | ((b0 >> 2) & 48u), ((b2 >> 4) & 15u) | ((b1 >> 2) & 48u));
}

item_words align_item(item_raw r, uint item) {
    const vec2 dm = unpackHalf2x16(r.head.x);
    const uint j = 2 * (item & 3u);
    const vec2 sm0 = scale_min_k4(r.head.yzw, j), sm1 = scale_min_k4(r.head.yzw, j + 1);
    const float a0 = float(1 << Q_BITS) * dm.x * sm0.x, a1 = float(1 << Q_BITS) * dm.x * sm1.x;
    item_words o;
    o.r = r;
    o.ab = vec4(a0, -a0 - dm.y * sm0.y, a1, -a1 - dm.y * sm1.y);
    return o;
}

// Group g: vector g % 2 of the chunk, low (g < 2) or high nibbles: values 16 g .. 16 g + 15.
uint group_x(uint item, uint g) { return 64 * item + 16 * g; }

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    const uint h = g & 1u, hi = g >> 1;
#if defined(DATA_A_Q4_K)
    const mat4 f = f16(w.r.qs[h], int(4 * hi), 4, 0.0);
#else
    const uint j = 2 * (item & 3u) + hi;
#define Q5_K_COLUMN(c) f4(((w.r.qs[h][c] >> (4 * hi)) & 0x0F0F0F0Fu) | (((w.r.qh[h][c] >> j) << 4) & 0x10101010u), 0, 5, 0.0)
    const mat4 f = COLUMNS(Q5_K_COLUMN);
#endif
    return hi == 0 ? w.ab.x * dot16(f, x) + w.ab.y * sx : w.ab.z * dot16(f, x) + w.ab.w * sx;
}

// ab from align_item's form (w = a * (1 + q / 2^bits) + b) to a * q / 2^bits + (a + b).
ivec4 group_quants(item_words w, uint item, uint g, out vec2 ab) {
    const uint h = g & 1u, hi = g >> 1;
    const vec2 f = hi == 0 ? w.ab.xy : w.ab.zw;
    ab = vec2(f.x * (1.0 / float(1 << Q_BITS)), f.x + f.y);
    uvec4 q = (w.r.qs[h] >> (4 * hi)) & 0x0F0F0F0Fu;
#if defined(DATA_A_Q5_K)
    q |= ((w.r.qh[h] >> (2 * (item & 3u) + hi)) << 4) & 0x10101010u;
#endif
    return ivec4(q);
}

item_words lane_word(item_words w, uint c) {
    [[unroll]] for (uint h = 0; h < 2; h++) {
        w.r.qs[h].x = pick4(w.r.qs[h], c);
#if defined(DATA_A_Q5_K)
        w.r.qh[h].x = pick4(w.r.qh[h], c);
#endif
    }
    return w;
}

#elif defined(DATA_A_Q2_K)
// 84 bytes: 16 scale bytes (low nibble scale, high nibble min), qs[64] of 2-bit codes, f16 d and
// dmin. An item is half n (128 values): value 32 j + l takes bits 2j .. 2j + 1 of qs[32 n + l],
// scale byte 8 n + 2 j + l / 16: d * sc * q - dmin * m.
#define BLOCK_BYTES 84
#define ITEM_VALUES 128
#define ITEM_GROUPS 8
#define ITEM_ALIGN 4
#define ITEM_RAW_WORDS 24
struct item_raw { uvec4 sc[2]; uvec4 qs[3]; uvec4 dm[1]; uint m; };
struct item_words { uint qs[8]; vec2 ab[8]; };

item_words align_item(item_raw r, uint item) {
    item_words o;
    ALIGN_SPAN(o.qs, 8, r.qs, 3, r.m)
    uint sc[4], dmw[1];
    ALIGN_SPAN(sc, 4, r.sc, 2, r.m)
    ALIGN_SPAN(dmw, 1, r.dm, 1, r.m)
    const vec2 dm = unpackHalf2x16(dmw[0]);
    const uint n = item & 1u;
#define Q2_K_SCALE(g) { \
        const uint b = ((n == 0 ? sc[g / 4] : sc[2 + g / 4]) >> (8 * (g % 4))) & 255u; \
        const float a = 4.0 * dm.x * float(b & 15u); \
        o.ab[g] = vec2(a, -a - dm.y * float(b >> 4)); \
    }
    EACH_GROUP(Q2_K_SCALE)
    return o;
}

uint group_x(uint item, uint g) { return 128 * item + 16 * g; }

// Group g's 16 bytes of qs (its values' codes at bits 2 (g / 2) .. of each byte).
uvec4 q2_k_words(item_words w, uint g) {
    const uint lh = g & 1u;
    return uvec4(w.qs[4 * lh], w.qs[4 * lh + 1], w.qs[4 * lh + 2], w.qs[4 * lh + 3]);
}

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
    const mat4 f = f16(q2_k_words(w, g), int(2 * (g >> 1)), 2, 0.0);
    return w.ab[g].x * dot16(f, x) + w.ab[g].y * sx;
}

// ab from align_item's form (w = a * (1 + q / 4) + b) to a * q / 4 + (a + b), as Q4_K's.
ivec4 group_quants(item_words w, uint item, uint g, out vec2 ab) {
    ab = vec2(w.ab[g].x * 0.25, w.ab[g].x + w.ab[g].y);
    return ivec4((q2_k_words(w, g) >> (2 * (g >> 1))) & 0x03030303u);
}

#elif defined(DATA_A_Q3_K)
// 110 bytes: hmask[32], qs[64] of 2-bit codes, 12 bytes of 6-bit scales, f16 d. An item is half
// n (128 values): value 32 j + l takes bits 2j .. 2j + 1 of qs[32 n + l] and, as third bit, bit
// 4n + j of hmask[l]; scale 8 n + 2 j + l / 16 (offset 32): d * sc * (q - 4).
#define BLOCK_BYTES 110
#define ITEM_VALUES 128
#define ITEM_GROUPS 8
#define ITEM_ALIGN 2
#define ITEM_RAW_WORDS 32
struct item_raw { uvec4 hm[3]; uvec4 qs[3]; uvec4 sd[2]; uint m; };
struct item_words { uint hm[8]; uint qs[8]; float dl[8]; };

item_words align_item(item_raw r, uint item) {
    item_words o;
    ALIGN_SPAN(o.hm, 8, r.hm, 3, r.m)
    ALIGN_SPAN(o.qs, 8, r.qs, 3, r.m)
    uint sd[4];
    ALIGN_SPAN(sd, 4, r.sd, 2, r.m)
    const float d = unpackHalf2x16(sd[3]).x;
    const uint n = item & 1u;
    // scale s = 8 n + g: low 4 bits in byte s % 8 (nibble s / 8), high 2 in byte 8 + s % 4
#define Q3_K_SCALE(g) { \
        const uint lo = (sd[g / 4] >> (8 * (g % 4) + 4 * n)) & 15u; \
        const uint hi = (sd[2] >> (8 * (g % 4) + 2 * (2 * n + g / 4))) & 3u; \
        o.dl[g] = d * float(int(lo | (hi << 4)) - 32); \
    }
    EACH_GROUP(Q3_K_SCALE)
    return o;
}

uint group_x(uint item, uint g) { return 128 * item + 16 * g; }

// The 3-bit codes q (hmask's bit as bit 2) of values 4c .. 4c + 3 of group g, a byte each:
// w = dl * (q - 4).
uint q3_k_codes(item_words w, uint item, uint g, uint c) {
    const uint j = g >> 1, lh = g & 1u, hbit = 4 * (item & 1u) + j;
    return ((w.qs[4 * lh + c] >> (2 * j)) & 0x03030303u) | (((w.hm[4 * lh + c] >> hbit) << 2) & 0x04040404u);
}

float group_dot(item_words w, uint item, uint g, mat4 x, float sx) {
#define Q3_K_COLUMN(c) f4(q3_k_codes(w, item, g, c), 0, 3, 1.5)
    return 8.0 * w.dl[g] * dot16(COLUMNS(Q3_K_COLUMN), x);
}

ivec4 group_quants(item_words w, uint item, uint g, out vec2 ab) {
    ab = vec2(w.dl[g], -4.0 * w.dl[g]);
    return ivec4(q3_k_codes(w, item, g, 0), q3_k_codes(w, item, g, 1), q3_k_codes(w, item, g, 2),
                 q3_k_codes(w, item, g, 3));
}

#elif defined(DATA_A_Q6_K)
// 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 signed scales, f16 d. An item is half
// n (128 values): value 32 t + l takes nibble t / 2 of ql[64 n + 32 (t % 2) + l] and bits
// 2t .. 2t + 1 of qh[32 n + l], scale 8 n + 2 t + l / 16: d * sc * (q - 32). Only the kernel over
// 8-bit x reads Q6_K items (group_quants): the f32 one measured faster on dequant.glsl's slices.
#define BLOCK_BYTES 210
#define ITEM_VALUES 128
#define ITEM_GROUPS 8
#define ITEM_ALIGN 2
#define ITEM_RAW_WORDS 40
struct item_raw { uvec4 ql[5]; uvec4 qh[3]; uvec4 sd[2]; uint m; };
struct item_words { uint ql[16]; uint qh[8]; float dl[8]; };

item_words align_item(item_raw r, uint item) {
    item_words o;
    ALIGN_SPAN(o.ql, 16, r.ql, 5, r.m)
    ALIGN_SPAN(o.qh, 8, r.qh, 3, r.m)
    uint sd[5];   // from byte 192: the scales, then d in the low half of word 4
    ALIGN_SPAN(sd, 5, r.sd, 2, r.m)
    const float d = unpackHalf2x16(sd[4]).x;
    const uint n = item & 1u;
#define Q6_K_SCALE(g) o.dl[g] = d * float(bitfieldExtract(int(sd[2 * n + g / 4]), 8 * (g % 4), 8));
    EACH_GROUP(Q6_K_SCALE)
    return o;
}

uint group_x(uint item, uint g) { return 128 * item + 16 * g; }

// Group g is quarter t = g / 2, values 16 (g % 2) .. of it.
ivec4 group_quants(item_words w, uint item, uint g, out vec2 ab) {
    const uint t = g >> 1, h = g & 1u, l = 8 * (t & 1u) + 4 * h;
    ab = vec2(w.dl[g], -32.0 * w.dl[g]);
    uvec4 q;
    [[unroll]] for (uint c = 0; c < 4; c++) {
        q[c] = ((w.ql[l + c] >> (4 * (t >> 1))) & 0x0F0F0F0Fu) | (((w.qh[4 * h + c] >> (2 * t)) & 0x03030303u) << 4);
    }
    return ivec4(q);
}

#else
#error "mul_mat_vec_items.glsl: no items for this type"
#endif

#else
layout(std430, binding = 1) readonly buffer A4_UP { uvec4 data_u4_up[]; };
#define data_u4 data_u4_up
#define load_item load_item_up
#endif

// The loads of item `item` of the row at byte row_byte (binding 0, or 1 as load_item_up).
#if defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
item_raw load_item(uint row_byte, uint item) {
    const uint v = row_byte / 16 + (item / 4) * (BLOCK_BYTES / 16), j = item & 3u;
    item_raw r;
    r.head = data_u4[v];
    r.qs[0] = data_u4[v + QS_VECTOR + 2 * j];
    r.qs[1] = data_u4[v + QS_VECTOR + 2 * j + 1];
#if defined(DATA_A_Q5_K)
    r.qh[0] = data_u4[v + 1];
    r.qh[1] = data_u4[v + 2];
#endif
    return r;
}
#elif defined(DATA_A_Q2_K)
item_raw load_item(uint row_byte, uint item) {
    const uint block = row_byte + (item / 2) * BLOCK_BYTES, n = item & 1u;
    item_raw r;
    LOAD_SPAN(r.sc, 2, block)
    LOAD_SPAN(r.qs, 3, block + 16 + 32 * n)
    LOAD_SPAN(r.dm, 1, block + 80)
    r.m = block % 16;
    return r;
}
#elif defined(DATA_A_Q6_K)
item_raw load_item(uint row_byte, uint item) {
    const uint block = row_byte + (item / 2) * BLOCK_BYTES, n = item & 1u;
    item_raw r;
    LOAD_SPAN(r.ql, 5, block + 64 * n)
    LOAD_SPAN(r.qh, 3, block + 128 + 32 * n)
    LOAD_SPAN(r.sd, 2, block + 192)
    r.m = block % 16;
    return r;
}
#elif defined(DATA_A_Q3_K)
item_raw load_item(uint row_byte, uint item) {
    const uint block = row_byte + (item / 2) * BLOCK_BYTES, n = item & 1u;
    item_raw r;
    LOAD_SPAN(r.hm, 3, block)
    LOAD_SPAN(r.qs, 3, block + 32 + 32 * n)
    LOAD_SPAN(r.sd, 2, block + 96)
    r.m = block % 16;
    return r;
}
#else
// One block per item, fetched as one span.
item_raw load_item(uint row_byte, uint item) {
    const uint block = row_byte + item * BLOCK_BYTES;
    item_raw r;
    LOAD_SPAN(r.v, r.v.length(), block)
    r.m = block % 16;
    return r;
}
#endif

#if defined(ITEMS_UP)
#undef data_u4
#undef load_item
#endif

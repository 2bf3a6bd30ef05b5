// Weights as stored in the GGUF file, bound at binding 0, and one dequantize signature for
// every type:
//   mat4 dequantize16(uint ib, uint s)
// gives the 16 consecutive values s*16 .. s*16+15 of block ib (column c holds values 4c .. 4c+3).
// Every type's scales are constant over such a slice, so each call decodes its scales once.
// Quantized types also give the slice's integer quants with its scale and offset (quants16,
// below), from which dequantize16 is made.
// Float types (QUANT_K 1): ib is the index of the first value and s is 0; also
//   float dequantize1(uint i)   value i, for rows whose length is not a multiple of 4 or 16
//   vec4 dequantize4(uint i4)   values 4*i4 .. 4*i4+3 in one load
// Layouts and formulas follow ggml's dequantize_row_* (gguf-py's gguf/quants.py is the check).
// A kernel over two weights of one type (gate and up) includes this file a second time with
// DEQUANT_UP defined: the same functions over binding 1, named *_up (GLSL functions cannot take
// a buffer, and the host binds one buffer per binding).
#if !defined(DEQUANT_UP)
#include "types.glsl"
#include "bytes.glsl"

layout(std430, binding = 0) readonly buffer A { A_TYPE data_a[]; };

uint word16(uint16_t lo, uint16_t hi) { return uint(lo) | (uint(hi) << 16); }
uint byte_of(uint w, uint i) { return (w >> (8 * i)) & 255u; }
// Bits 0..3 of `h` spread to bit 0 of bytes 0..3.
uint spread4(uint h) { return (h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21); }

#if defined(DATA_A_MXFP4)
// MXFP4's e2m1 values, doubled (dequantize16 halves the e8m0 scale).
const float kvalues_mxfp4[16] = float[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
#endif

#else
layout(std430, binding = 1) readonly buffer A_UP { A_TYPE data_a_up[]; };
#define data_a data_a_up
#define dequantize1 dequantize1_up
#define dequantize4 dequantize4_up
#define dequantize16 dequantize16_up
#define quants16 quants16_up
#define scale_min_k4 scale_min_k4_up
#define q3_k_scale_byte q3_k_scale_byte_up
#endif

#if QUANT_K == 1
vec4 dequantize4(uint i4) {
#if defined(DATA_A_BF16)
    return uintBitsToFloat(uvec4(data_a[i4]) << 16);
#else
    return vec4(data_a[i4]);
#endif
}

float dequantize1(uint i) {
#if defined(DATA_A_BF16)
    return uintBitsToFloat(uint(data_a[i / 4][i % 4]) << 16);
#else
    return float(data_a[i / 4][i % 4]);
#endif
}

mat4 dequantize16(uint ib, uint s) {
    if (ib % 4 == 0) {
        return mat4(dequantize4(ib / 4), dequantize4(ib / 4 + 1), dequantize4(ib / 4 + 2), dequantize4(ib / 4 + 3));
    }
    mat4 v;
    for (uint c = 0; c < 4; c++) {
        v[c] = vec4(dequantize1(ib + 4 * c), dequantize1(ib + 4 * c + 1),
                    dequantize1(ib + 4 * c + 2), dequantize1(ib + 4 * c + 3));
    }
    return v;
}

#else
// Quantized types: ivec4 quants16(ib, s, out vec2 ab) gives the 16 integer quants of slice s as
// signed bytes (component c holds values 4c .. 4c+3, byte i value 4c + i) and the slice's scale
// and offset: value = ab.x * q + ab.y. The mmq kernels dot the quants with 8-bit activations
// (mul_mmq.comp); dequantize16, after the types, applies ab to them.

#if defined(DATA_A_Q4_0)
// Value j < 16 is the low nibble of qs[j], value j + 16 its high nibble: d * (q - 8).
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const float d = float(data_a[ib].d);
    ab = vec2(d, -8.0 * d);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        q[c] = (word16(data_a[ib].qs[2 * c], data_a[ib].qs[2 * c + 1]) >> (4 * s)) & 0x0F0F0F0Fu;
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q4_1)
// As Q4_0 without the offset: d * q + m.
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    ab = vec2(data_a[ib].dm);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        q[c] = (data_a[ib].qs[c] >> (4 * s)) & 0x0F0F0F0Fu;
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q5_0)
// Q4_0's nibbles plus a fifth bit from qh (bit j for value j): d * (q - 16).
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const float d = float(data_a[ib].d);
    ab = vec2(d, -16.0 * d);
    const uint qh = word16(data_a[ib].qh[0], data_a[ib].qh[1]) >> (16 * s);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        const uint w = word16(data_a[ib].qs[2 * c], data_a[ib].qs[2 * c + 1]);
        q[c] = ((w >> (4 * s)) & 0x0F0F0F0Fu) | (spread4(qh >> (4 * c)) << 4);
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q5_1)
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    ab = vec2(data_a[ib].dm);
    const uint qh = data_a[ib].qh >> (16 * s);
    const uvec2 qs[2] = data_a[ib].qs;
    const uint words[4] = uint[4](qs[0].x, qs[0].y, qs[1].x, qs[1].y);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        q[c] = ((words[c] >> (4 * s)) & 0x0F0F0F0Fu) | (spread4(qh >> (4 * c)) << 4);
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q8_0)
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    ab = vec2(float(data_a[ib].d), 0.0);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        q[c] = word16(data_a[ib].qs[8 * s + 2 * c], data_a[ib].qs[8 * s + 2 * c + 1]);
    }
    return ivec4(q);
}

#elif defined(DATA_A_MXFP4)
// 17-byte blocks: bytes only. e8m0 scale halved because the e2m1 table is doubled.
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    ab = vec2(exp2(float(uint(data_a[ib].e)) - 128.0), 0.0);
    ivec4 q;
    for (uint c = 0; c < 4; c++) {
        ivec4 v;
        for (uint i = 0; i < 4; i++) {
            v[i] = int(kvalues_mxfp4[(uint(data_a[ib].qs[4 * c + i]) >> (4 * s)) & 15u]);
        }
        q[c] = int(pack32(i8vec4(v)));
    }
    return q;
}

#elif defined(DATA_A_Q2_K)
// Slice s: 2-bit codes at shift 2*((s%8)/2) of qs[32*(s/8) + 16*(s%2) ...]; scale byte s holds
// the 4-bit scale (low) and min (high): d * sc * q - dmin * m.
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const vec2 dm = vec2(data_a[ib].dm);
    const uint sc = byte_of(data_a[ib].scales[s / 4], s % 4);
    ab = vec2(dm.x * float(sc & 15u), -dm.y * float(sc >> 4));
    const uint base = 8 * (s >> 3) + 4 * (s & 1u), shift = 2 * ((s & 7u) >> 1);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        q[c] = (data_a[ib].qs[base + c] >> shift) & 0x03030303u;
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q3_K)
// 2 low bits as Q2_K, the third from hmask (bit 4*(s/8) + (s%8)/2 of hmask[16*(s%2) + l]),
// q - 4 when that bit is clear; 6-bit signed scales packed in 12 bytes (offset 32).
uint q3_k_scale_byte(uint ib, uint i) { return byte_of(uint(data_a[ib].scales[i / 2]), i % 2); }

ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const uint lo = (q3_k_scale_byte(ib, s % 8) >> (4 * (s / 8))) & 15u;
    const uint hi = (q3_k_scale_byte(ib, 8 + s % 4) >> (2 * (s / 4))) & 3u;
    const float dl = float(data_a[ib].d) * float(int(lo | (hi << 4)) - 32);
    ab = vec2(dl, -4.0 * dl);
    const uint j = (s & 7u) >> 1, shift = 2 * j, hbit = 4 * (s >> 3) + j;
    const uint qbase = 16 * (s >> 3) + 8 * (s & 1u), hbase = 8 * (s & 1u);
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        const uint l = word16(data_a[ib].qs[qbase + 2 * c], data_a[ib].qs[qbase + 2 * c + 1]);
        const uint h = word16(data_a[ib].hmask[hbase + 2 * c], data_a[ib].hmask[hbase + 2 * c + 1]);
        q[c] = ((l >> shift) & 0x03030303u) | (((h >> hbit) & 0x01010101u) << 2);
    }
    return ivec4(q);
}

#elif defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
// 6-bit scale and min of sub-block j (0..7) of 32 values (ggml's get_scale_min_k4), from the
// three scale words without branches.
vec2 scale_min_k4(uint ib, uint j) {
    const uint w0 = data_a[ib].scales[0], w1 = data_a[ib].scales[1], w2 = data_a[ib].scales[2];
    const uint i = j % 4;
    const uint b0 = byte_of(w0, i), b1 = byte_of(w1, i), b2 = byte_of(w2, i);
    return j < 4 ? vec2(b0 & 63u, b1 & 63u)
                 : vec2((b2 & 15u) | ((b0 >> 6) << 4), (b2 >> 4) | ((b1 >> 6) << 4));
}

// Sub-block j = s/2 takes the low (j even) or high nibbles of qs[32*(j/2) + 16*(s%2) ...];
// Q5_K adds bit j of qh[16*(s%2) + l] as the fifth bit: d * sc * q - dmin * m.
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const vec2 dm = vec2(data_a[ib].dm);
    const uint j = s >> 1;
    const vec2 sm = scale_min_k4(ib, j);
    ab = vec2(dm.x * sm.x, -dm.y * sm.y);
    const uvec4 qs = (data_a[ib].qs[2 * (j >> 1) + (s & 1u)] >> (4 * (j & 1u))) & 0x0F0F0F0Fu;
#if defined(DATA_A_Q5_K)
    return ivec4(qs | (((data_a[ib].qh[s & 1u] >> j) & 0x01010101u) << 4));
#else
    return ivec4(qs);
#endif
}

#elif defined(DATA_A_Q6_K)
// Half n = s/8 of the superblock; quarter t = (s%8)/2 takes the low (t < 2) or high nibbles of
// ql[64n + 32*(t%2) + 16*(s%2) ...] and bits 2t..2t+1 of qh[32n + 16*(s%2) ...]: d * sc * (q - 32).
ivec4 quants16(uint ib, uint s, out vec2 ab) {
    const int sc = bitfieldExtract(int(uint(data_a[ib].scales[s / 2])), int(8 * (s % 2)), 8);
    const float dl = float(data_a[ib].d) * float(sc);
    ab = vec2(dl, -32.0 * dl);
    const uint n = s >> 3, t = (s & 7u) >> 1, half_ = s & 1u;
    const uint lbase = 32 * n + 16 * (t & 1u) + 8 * half_, hbase = 16 * n + 8 * half_;
    const uint lshift = 4 * (t >> 1), hshift = 2 * t;
    uvec4 q;
    for (uint c = 0; c < 4; c++) {
        const uint l = word16(data_a[ib].ql[lbase + 2 * c], data_a[ib].ql[lbase + 2 * c + 1]);
        const uint h = word16(data_a[ib].qh[hbase + 2 * c], data_a[ib].qh[hbase + 2 * c + 1]);
        q[c] = ((l >> lshift) & 0x0F0F0F0Fu) | (((h >> hshift) & 0x03030303u) << 4);
    }
    return ivec4(q);
}
#endif

mat4 dequantize16(uint ib, uint s) {
    vec2 ab;
    const uvec4 q = uvec4(quants16(ib, s, ab));
    return mat4(sbytes4(q.x) * ab.x + ab.y, sbytes4(q.y) * ab.x + ab.y, sbytes4(q.z) * ab.x + ab.y,
                sbytes4(q.w) * ab.x + ab.y);
}
#endif

#if defined(DEQUANT_UP)
#undef data_a
#undef dequantize1
#undef dequantize4
#undef dequantize16
#undef quants16
#undef scale_min_k4
#undef q3_k_scale_byte
#endif

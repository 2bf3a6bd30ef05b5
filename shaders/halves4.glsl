// Quants to packed f16 for the cooperative-matrix kernels that dequantize items
// (mul_mat_coopmat.comp's ITEMS, mul_mat_coopmat_frag.comp). They keep K in each run of 4 values
// in the order 0, 2, 1, 3 in both operands (the product is the same): then a pair of f16 from
// the bytes 0 and 2 (or 1 and 3) of a word of quants is one masked OR, 1024 + q exactly, and a
// value two packed f16 operations. The quants are unsigned bytes (mul_mat_vec_items.glsl's
// group_quants), w = a * q + b: halves4 gives (w0, w2) and (w1, w3).
uvec2 halves4(uint q, f16vec2 a, f16vec2 b) {
    const f16vec2 even = unpackFloat2x16((q & 0x00FF00FFu) | 0x64006400u) - float16_t(1024.0);
    const f16vec2 odd = unpackFloat2x16(((q >> 8) & 0x00FF00FFu) | 0x64006400u) - float16_t(1024.0);
    return uvec2(packFloat2x16(fma(even, a, b)), packFloat2x16(fma(odd, a, b)));
}

// Four f16 of x in natural order (pairs 01 23) into that order: (x0, x2) and (x1, x3).
uvec2 interleave4(uvec2 x) {
    return uvec2((x.x & 0xFFFFu) | (x.y << 16), (x.x >> 16) | (x.y & 0xFFFF0000u));
}

// Helpers of mul_mat_vec_items.glsl's per-type sections: quant bits placed in a float's mantissa
// (fbits, f4, f16, sum16), the spans of 16-byte vectors an item loads from binding 0's uvec4 view
// data_u4 and their alignment in registers (LOAD_SPAN, ALIGN_SPAN, funnel), and literal-index
// helpers (COLUMNS, EACH_GROUP).
// f = 1 + q / 2^bits for the field of `bits` bits at bit `pos` of w (pos may be past 31 - bits
// only when the field is known to be zero there); pos and bits are constants after inlining.
// The field lands at bits 23-bits .. 22 of 1.0.
float fbits(uint w, int pos, uint bits) {
    const int place = 23 - int(bits), s = pos - place;
    const uint v = s >= 0 ? w >> s : w << -s;
    return uintBitsToFloat((v & (((1u << bits) - 1u) << place)) | 0x3F800000u);
}

// The four fields at pos, pos + 8, pos + 16, pos + 24 (one per byte), minus `center`.
vec4 f4(uint w, int pos, uint bits, float center) {
    return vec4(fbits(w, pos, bits), fbits(w, pos + 8, bits), fbits(w, pos + 16, bits), fbits(w, pos + 24, bits)) - center;
}

// 16 values, column c from word c.
mat4 f16(uvec4 w, int pos, uint bits, float center) {
    return mat4(f4(w.x, pos, bits, center), f4(w.y, pos, bits, center), f4(w.z, pos, bits, center), f4(w.w, pos, bits, center));
}

float sum16(mat4 a) {
    return dot(a[0] + a[1] + a[2] + a[3], vec4(1.0));
}

// The vectors covering V * 16 bytes from byte `byte` of binding 0, indices clamped to the
// buffer (bytes past a row's end are loaded from wherever and never used).
#define LOAD_SPAN(dst, V, byte) \
    [[unroll]] for (uint i_ = 0; i_ < V; i_++) { \
        dst[i_] = data_u4[min((byte) / 16 + i_, uint(data_u4.length()) - 1)]; \
    }

// dst[0 .. W) = the words at byte m (the span's start % 16, a multiple of ITEM_ALIGN) of the
// vectors src[0 .. V): the vectors' words moved down by m / 4 (two selects per word), then, for
// blocks aligned to less than 4 bytes, each word funnel-shifted by the rest.
#define ALIGN_SPAN(dst, W, src, V, m) { \
    uint r_[4 * V + 2]; \
    [[unroll]] for (uint i_ = 0; i_ < V; i_++) { \
        r_[4 * i_] = src[i_].x; r_[4 * i_ + 1] = src[i_].y; r_[4 * i_ + 2] = src[i_].z; r_[4 * i_ + 3] = src[i_].w; \
    } \
    r_[4 * V] = 0u; r_[4 * V + 1] = 0u; \
    if (ITEM_ALIGN < 16) { \
        const bool by8_ = ((m) & 8u) != 0, by4_ = ((m) & 4u) != 0; \
        [[unroll]] for (uint j_ = 0; j_ < 4 * V; j_++) { r_[j_] = by8_ ? r_[j_ + 2] : r_[j_]; } \
        [[unroll]] for (uint j_ = 0; j_ < 4 * V; j_++) { r_[j_] = by4_ ? r_[j_ + 1] : r_[j_]; } \
    } \
    [[unroll]] for (uint j_ = 0; j_ < W; j_++) { dst[j_] = funnel(r_[j_], r_[j_ + 1], (m) & 3u, ITEM_ALIGN); } \
}

// Bytes b .. b + 3 of the pair (lo, hi) as one word, b < 4 (0 when align >= 4).
uint funnel(uint lo, uint hi, uint b, uint align) {
    if (align >= 4) {
        return lo;
    }
    if (align == 2) {
        return b != 0 ? (lo >> 16) | (hi << 16) : lo;
    }
    return b != 0 ? (lo >> (8 * b)) | (hi << (32 - 8 * b)) : lo;
}

// Word i of w, shifted by 16 bits: for fields that sit 2 bytes into an aligned block.
#define HALF_SHIFTED(w, i) (((w)[i] >> 16) | ((w)[(i) + 1] << 16))

// Literal indices for the per-value code (loops would leave them variables in the SPIR-V): F(c)
// for the four columns of a group, F(g) for the eight groups of an item.
#define COLUMNS(F) mat4(F(0), F(1), F(2), F(3))
#define EACH_GROUP(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)

// Word c of v, by selects (a run-time index into a vector may put it in local memory).
uint pick4(uvec4 v, uint c) {
    return c < 2 ? (c == 0 ? v.x : v.y) : (c == 2 ? v.z : v.w);
}

// A lane's share of the weights for mul_mat_coopmat_frag.comp (Q4_K, Q5_K, Q6_K): the four lanes
// t = 0 .. 3 of a row each take word t of every 16-value group's quants (values 4t .. 4t + 3 of
// the group). A lane item is a 64-value chunk of a block (Q4_K, Q5_K: its 16-byte vectors loaded
// whole, the four lanes of a row loading the same ones) or half a block (Q6_K: lane t loads only
// its words and the scales, 32-bit loads, the four lanes reading 16 consecutive bytes):
//   BLOCK_BYTES, LANE_ITEM_VALUES (values per lane item), LANE_GROUPS (16-value groups per item)
//   lane_raw load_lane(uint row_byte, uint item, uint t)   the loads of lane t's item
//   lane_item lane_words(lane_raw r)                          the lane's words in place (Q6_K's
//                                                             blocks are 2-byte aligned: loads of
//                                                             the aligned words around them,
//                                                             shifted here)
//   uint lane_quants(lane_item w, uint grp, out vec2 ab)      the lane's four quants of group grp as
//                                                             unsigned bytes, w_i = ab.x * q_i + ab.y
// Layouts follow ggml's dequantize_row_* (as mul_mat_vec_items.glsl's sections of these types).
#include "types.glsl"
#include "item_bits.glsl"
#include "k_scales.glsl"

layout(std430, binding = 0) readonly buffer A1 { uint data_u32[]; };
layout(std430, binding = 0) readonly buffer A4 { uvec4 data_u4[]; };   // the same, 16 bytes an element

#if defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
// Q4_K, 144 bytes: f16 d and dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles (8
// vectors of 16 bytes). Q5_K, 176 bytes: the same with 32 bytes of fifth bits (2 vectors) before
// the nibbles. Group g of 64-value chunk j (qs vectors 2j and 2j + 1) takes vector 2j + g % 2, low
// nibbles (sub-block 2j) for g < 2, else high (2j + 1); Q5_K's fifth bit of sub-block s is bit s
// of each byte of qh vector g % 2. d * sc * q - dmin * m.
#if defined(DATA_A_Q4_K)
#define BLOCK_BYTES 144
#define QS_BYTE 16
#else
#define BLOCK_BYTES 176
#define QS_BYTE 48
#endif
// Lane item j is chunk j % 4 of block j / 4: the head and the chunk's nibble vectors (Q5_K: and the
// fifth-bit vectors) loaded whole, lane t keeping word t of each. Loading only word t of each
// measured slower (H100, 2026-12-08, 8 / 32 columns, us): a chunk an item 6144x4096 27.1 / 31.2
// against 22.3 / 27.8, 14336x4096 gate+up 93.4 / 113.7 against 74.2 / 99.8; a block an item
// about even but 4096x14336 38.9 / 50.4 against 36.9 / 47.4.
#define LANE_ITEM_VALUES 64
#define LANE_GROUPS 4
struct lane_raw {
    uvec4 head;    // d and dmin, the three scale words
    uvec4 qs[2];   // the chunk's nibble vectors
#if defined(DATA_A_Q5_K)
    uvec4 qh[2];   // the fifth-bit vectors
#endif
    uint j, t;
};
struct lane_item {
    uvec4 head;
    uint qs[2];
#if defined(DATA_A_Q5_K)
    uint qh[2];
#endif
    uint j;
};

lane_raw load_lane(uint row_byte, uint item, uint t) {
    const uint v = (row_byte + (item / 4) * BLOCK_BYTES) / 16;
    lane_raw r;
    r.j = item & 3u;
    r.t = t;
    r.head = data_u4[v];
    r.qs[0] = data_u4[v + QS_BYTE / 16 + 2 * r.j];
    r.qs[1] = data_u4[v + QS_BYTE / 16 + 2 * r.j + 1];
#if defined(DATA_A_Q5_K)
    r.qh[0] = data_u4[v + 1];
    r.qh[1] = data_u4[v + 2];
#endif
    return r;
}

// Word c of v by selects: indexing a vector by a run-time c put the words in local memory (H100,
// gate+up at 8 columns 118.5 us against 74.0).
uint pick4(uvec4 v, uint c) {
    return c < 2 ? (c == 0 ? v.x : v.y) : (c == 2 ? v.z : v.w);
}

lane_item lane_words(lane_raw r) {
    lane_item o;
    o.head = r.head;
    o.j = r.j;
    [[unroll]] for (uint h = 0; h < 2; h++) {
        o.qs[h] = pick4(r.qs[h], r.t);
#if defined(DATA_A_Q5_K)
        o.qh[h] = pick4(r.qh[h], r.t);
#endif
    }
    return o;
}

uint lane_quants(lane_item w, uint grp, out vec2 ab) {
    const uint h = grp & 1u, hi = grp >> 1, s = 2 * w.j + hi;
    const vec2 dm = unpackHalf2x16(w.head.x), sm = scale_min_k4(w.head.yzw, s);
    ab = vec2(dm.x * sm.x, -dm.y * sm.y);
    uint q = (w.qs[h] >> (4 * hi)) & 0x0F0F0F0Fu;
#if defined(DATA_A_Q5_K)
    q |= ((w.qh[h] >> s) << 4) & 0x10101010u;
#endif
    return q;
}

#elif defined(DATA_A_Q6_K)
// 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), 16 signed scales, f16 d. A lane item is
// half n (128 values): group grp is value 16 (grp % 2) .. of quarter u = grp / 2, whose value
// 32 u + l takes nibble u / 2 of ql[64 n + 32 (u % 2) + l] and bits 2u .. 2u + 1 of
// qh[32 n + l]; scale 8 n + grp: d * sc * (q - 32). Blocks are 2-byte aligned: a lane loads the
// aligned words around each of its words (lo, hi) and lane_words joins them (item_bits.glsl's
// funnel).
#define BLOCK_BYTES 210
#define LANE_ITEM_VALUES 128
#define LANE_GROUPS 8
struct lane_raw {
    uint ql[8];   // (lo, hi) of word t of ql's 16-byte runs 0 .. 3
    uint qh[4];   // (lo, hi) of word t of qh's runs 0 .. 1
    uint sc[3];   // the aligned words around the item's 8 scales
    uint d;       // the aligned word holding d
    uint m;       // block % 4: 2 where the block starts 2 bytes into a word
};
struct lane_item { uint ql[4]; uint qh[2]; uint sc[2]; float d; };

lane_raw load_lane(uint row_byte, uint item, uint t) {
    const uint block = row_byte + (item / 2) * BLOCK_BYTES, n = item & 1u, w = block / 4;
    lane_raw r;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        const uint at = w + (64 * n + 16 * i) / 4 + t;
        r.ql[2 * i] = data_u32[at];
        r.ql[2 * i + 1] = data_u32[at + 1];
    }
    [[unroll]] for (uint h = 0; h < 2; h++) {
        const uint at = w + (128 + 32 * n + 16 * h) / 4 + t;
        r.qh[2 * h] = data_u32[at];
        r.qh[2 * h + 1] = data_u32[at + 1];
    }
    [[unroll]] for (uint i = 0; i < 3; i++) {
        r.sc[i] = data_u32[w + (192 + 8 * n) / 4 + i];
    }
    r.d = data_u32[w + 208 / 4];
    r.m = block % 4;
    return r;
}

lane_item lane_words(lane_raw r) {
    lane_item o;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        o.ql[i] = funnel(r.ql[2 * i], r.ql[2 * i + 1], r.m, 2);
    }
    [[unroll]] for (uint h = 0; h < 2; h++) {
        o.qh[h] = funnel(r.qh[2 * h], r.qh[2 * h + 1], r.m, 2);
    }
    [[unroll]] for (uint i = 0; i < 2; i++) {
        o.sc[i] = funnel(r.sc[i], r.sc[i + 1], r.m, 2);
    }
    o.d = unpackHalf2x16(r.d >> (8 * r.m)).x;
    return o;
}

uint lane_quants(lane_item w, uint grp, out vec2 ab) {
    const uint u = grp >> 1, h = grp & 1u;
    const float dl = w.d * float(bitfieldExtract(int(w.sc[grp >> 2]), int(8 * (grp & 3u)), 8));
    ab = vec2(dl, -32.0 * dl);
    return ((w.ql[2 * (u & 1u) + h] >> (4 * (u >> 1))) & 0x0F0F0F0Fu) | (((w.qh[h] >> (2 * u)) & 0x03030303u) << 4);
}

#else
#error "lane_items.glsl: no lane items for this type"
#endif

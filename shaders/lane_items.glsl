// A lane's share of the weights for mul_mat_coopmat_frag.comp (Q4_K, Q5_K, Q6_K): the four lanes
// t = 0 .. 3 of a row each take word t of every 16-value group's quants (values 4t .. 4t + 3 of
// the group). A lane item is a 64-value chunk of a block (Q4_K, Q5_K: mul_mat_vec_items.glsl's
// items, their 16-byte vectors loaded whole, the four lanes of a row loading the same ones) or
// half a block (Q6_K: lane t loads only its words and the scales, 32-bit loads, the four lanes
// reading 16 consecutive bytes):
//   BLOCK_BYTES, LANE_ITEM_VALUES (values per lane item), LANE_GROUPS (16-value groups per item)
//   lane_raw load_lane(uint row_byte, uint item, uint t)   the loads of lane t's item
//   lane_item lane_words(lane_raw r)                          the lane's words in place (Q6_K's
//                                                             blocks are 2-byte aligned: loads of
//                                                             the aligned words around them,
//                                                             shifted here)
//   uint lane_quants(lane_item w, uint grp, out vec2 ab)      the lane's four quants of group grp as
//                                                             unsigned bytes, w_i = ab.x * q_i + ab.y
// Layouts follow ggml's dequantize_row_* (as mul_mat_vec_items.glsl's sections of these types).
#if defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
// Lane item j is mul_mat_vec_items.glsl's item j (64-value chunk j % 4 of block j / 4: the head and
// the chunk's vectors loaded whole), lane t keeping word t of each group (lane_word). Loading only
// word t of each measured slower (H100, 2026-12-08, 8 / 32 columns, us): a chunk an item
// 6144x4096 27.1 / 31.2 against 22.3 / 27.8, 14336x4096 gate+up 93.4 / 113.7 against 74.2 /
// 99.8; a block an item about even but 4096x14336 38.9 / 50.4 against 36.9 / 47.4.
#include "mul_mat_vec_items.glsl"
#define LANE_ITEM_VALUES ITEM_VALUES
#define LANE_GROUPS ITEM_GROUPS
struct lane_raw { item_raw r; uint item, t; };
struct lane_item { item_words w; uint item; };

lane_raw load_lane(uint row_byte, uint item, uint t) {
    return lane_raw(load_item(row_byte, item), item, t);
}

lane_item lane_words(lane_raw r) {
    return lane_item(lane_word(align_item(r.r, r.item), r.t), r.item);
}

uint lane_quants(lane_item w, uint grp, out vec2 ab) {
    return uint(group_quants(w.w, w.item, grp, ab).x);
}

#elif defined(DATA_A_Q6_K)
#include "types.glsl"
#include "item_bits.glsl"

layout(std430, binding = 0) readonly buffer A1 { uint data_u32[]; };

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

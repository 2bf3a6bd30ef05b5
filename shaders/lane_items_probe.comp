#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "lane_items.glsl"

// The weights as mul_mat_coopmat_frag.comp's lanes take them, dequantized: invocation 4 row + t
// loads lane t's words of every lane item of its row (lane_items.glsl) and writes its four values
// of each group, ab.x * q + ab.y, in their places in the row. A device without NVIDIA's matrix
// layout (CI's lavapipe) runs no frag kernel; tests/test_lane_items.py checks the lanes'
// loads there against gguf's dequantization through this kernel.
layout(std430, binding = 1) writeonly buffer Out { float values[]; };
layout(push_constant) uniform Push { uint rows; uint ncols; } p;

void main() {
    const uint row = gl_GlobalInvocationID.x / 4, t = gl_GlobalInvocationID.x % 4;
    if (row >= p.rows) {
        return;
    }
    const uint row_byte = row * (p.ncols / QUANT_K) * BLOCK_BYTES;
    for (uint item = 0; item < p.ncols / LANE_ITEM_VALUES; item++) {
        const lane_item w = lane_words(load_lane(row_byte, item, t));
        [[unroll]] for (uint grp = 0; grp < LANE_GROUPS; grp++) {
            vec2 ab;
            const uint q = lane_quants(w, grp, ab);
            const uint at = row * p.ncols + item * LANE_ITEM_VALUES + 16 * grp + 4 * t;
            [[unroll]] for (uint i = 0; i < 4; i++) {
                values[at + i] = ab.x * float((q >> (8 * i)) & 0xFFu) + ab.y;
            }
        }
    }
}

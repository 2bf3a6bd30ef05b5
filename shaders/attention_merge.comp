#version 450
#include "common.glsl"

// Merges the split partials of attention.comp (flash-decoding): workgroup (h, t) combines
// out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s with M = max_s m_s. Empty splits carry
// l = 0 and a hugely negative m, so they weigh nothing. With SINKS head h's sink logit joins the
// denominator (attention.comp says how), once, here.
layout(std430, binding = 0) readonly buffer PartO { float part_o[]; };
layout(std430, binding = 1) readonly buffer PartML { vec2 part_ml[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
#if defined(SINKS)
layout(std430, binding = 3) readonly buffer Sinks { float sinks[]; };
#endif
layout(push_constant) uniform Push { uint n_splits; uint head_dim; } p;

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint first = row * p.n_splits;
    float big_m = part_ml[first].x;
    for (uint s = 1; s < p.n_splits; s++) {
        big_m = max(big_m, part_ml[first + s].x);
    }
    float big_l = 0.0;
    for (uint s = 0; s < p.n_splits; s++) {
        const vec2 ml = part_ml[first + s];
        big_l += exp(ml.x - big_m) * ml.y;
    }
#if defined(SINKS)
    const float sink = sinks[gl_WorkGroupID.x], m_all = max(big_m, sink);
    big_l = big_l * exp(big_m - m_all) + exp(sink - m_all);
    big_m = m_all;
#endif
    for (uint d = gl_LocalInvocationID.x; d < p.head_dim; d += gl_WorkGroupSize.x) {
        float sum = 0.0;
        for (uint s = 0; s < p.n_splits; s++) {
            sum += exp(part_ml[first + s].x - big_m) * part_o[(first + s) * p.head_dim + d];
        }
        o[row * p.head_dim + d] = sum / big_l;
    }
}

#version 450
#if defined(X8)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"

// Merges the split partials of attention.comp (flash-decoding): workgroup (h, t) combines
// out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s with M = max_s m_s, a 4-vector of the
// head per invocation. Empty splits carry l = 0 and a hugely negative m, so they weigh nothing.
// With SINKS head h's sink logit joins the denominator (attention.comp says how), once, here.
// With X8 the output is also written in x8.glsl's 8-bit blocks, the input of the 8-bit mat-vec
// products (heads of a multiple of 32 values: a block's 8 invocations hold one head's values).
layout(std430, binding = 0) readonly buffer PartO { vec4 part_o4[]; };
layout(std430, binding = 1) readonly buffer PartML { vec2 part_ml[]; };
layout(std430, binding = 2) writeonly buffer O { vec4 o4[]; };
#if defined(SINKS)
layout(std430, binding = 3) readonly buffer Sinks { float sinks[]; };
#define X8_BINDING 4
#else
#define X8_BINDING 3
#endif
#if defined(X8)
#include "x8.glsl"
layout(std430, binding = X8_BINDING) writeonly buffer Q { uint q8[]; };
#include "x8_store.glsl"
#endif
layout(push_constant) uniform Push { uint n_splits; uint head_dim; } p;

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint first = row * p.n_splits, n4 = p.head_dim / 4;
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
    for (uint i = gl_LocalInvocationID.x; i < n4; i += gl_WorkGroupSize.x) {
        vec4 sum = vec4(0.0);
        for (uint s = 0; s < p.n_splits; s++) {
            sum += exp(part_ml[first + s].x - big_m) * part_o4[(first + s) * n4 + i];
        }
        const vec4 v = sum / big_l;
        o4[row * n4 + i] = v;
#if defined(X8)
        store_x8(row * n4 + i, v, gl_NumWorkGroups.x * p.head_dim);
#endif
    }
}

#version 450
#include "common.glsl"
#include "reduce.glsl"

// One workgroup per row: out[r] = exp(x[r] - max) / sum(exp(x[r] - max)). `out` may alias `x`.
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint cols; } p;

void main() {
    const uint base = gl_WorkGroupID.x * p.cols;
    float m = NEG_INF;
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        m = max(m, x[base + c]);
    }
    m = workgroup_max(m);
    float sum = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        sum += exp(x[base + c] - m);
    }
    const float inv = 1.0 / workgroup_sum(sum);
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        o[base + c] = exp(x[base + c] - m) * inv;
    }
}

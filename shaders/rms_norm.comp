#version 450
#include "common.glsl"
#include "reduce.glsl"

// One workgroup per row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. With GATHER,
// out[r] = that of x[rows[r]] (the output norm of a batched pass, over the tokens that get logits).
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
#if defined(GATHER)
layout(std430, binding = 3) readonly buffer Rows { uint rows[]; };
#endif
layout(push_constant) uniform Push { uint cols; float eps; } p;

void main() {
#if defined(GATHER)
    const uint base = rows[gl_WorkGroupID.x] * p.cols;
#else
    const uint base = gl_WorkGroupID.x * p.cols;
#endif
    const uint out_base = gl_WorkGroupID.x * p.cols;
    float sum = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        const float v = x[base + c];
        sum += v * v;
    }
    const float inv = inversesqrt(workgroup_sum(sum) / float(p.cols) + p.eps);
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        o[out_base + c] = x[base + c] * inv * w[c];
    }
}

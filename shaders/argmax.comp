#version 450
#include "common.glsl"
#include "reduce.glsl"

// One workgroup per row: the index of the largest value, the first one on ties.
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { uint o[]; };
layout(push_constant) uniform Push { uint cols; } p;

void main() {
    const uint base = gl_WorkGroupID.x * p.cols;
    float best = NEG_INF;
    uint index = 0xFFFFFFFFu;
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x) {
        const float v = x[base + c];
        if (v > best || index == 0xFFFFFFFFu) {  // ascending c: strictly greater keeps the first
            best = v;
            index = c;
        }
    }
    workgroup_best(best, index);
    if (gl_LocalInvocationID.x == 0) {
        o[gl_WorkGroupID.x] = index;
    }
}

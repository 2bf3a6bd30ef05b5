#version 450
#include "common.glsl"

// Reads a buffer once, as fast as the device allows: the decode roofline `vkllm bench` reports
// against. Each workgroup sums a contiguous span of vec4s and writes one float.
layout(std430, binding = 0) readonly buffer Src { vec4 src[]; };
layout(std430, binding = 1) writeonly buffer Dst { float dst[]; };
layout(push_constant) uniform Push { uint n_vec4; uint per_group; } p;

shared float partial[64];

void main() {
    const uint begin = gl_WorkGroupID.x * p.per_group;
    const uint end = min(begin + p.per_group, p.n_vec4);
    vec4 acc = vec4(0.0);
    for (uint i = begin + gl_LocalInvocationID.x; i < end; i += gl_WorkGroupSize.x) {
        acc += src[i];
    }
    float s = subgroupAdd(acc.x + acc.y + acc.z + acc.w);
    if (subgroupElect()) {
        partial[gl_SubgroupID] = s;
    }
    barrier();
    if (gl_LocalInvocationID.x == 0) {
        float total = 0.0;
        for (uint i = 0; i < gl_NumSubgroups; ++i) {
            total += partial[i];
        }
        dst[gl_WorkGroupID.x] = total;
    }
}

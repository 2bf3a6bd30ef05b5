#version 450
#include "common.glsl"

// out = a + b, elementwise over n floats.
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < p.n) {
        o[i] = a[i] + b[i];
    }
}

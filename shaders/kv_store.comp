#version 450
#include "common.glsl"

// Appends n_tokens rows of K or V (f32 [n_tokens, width]) to an f16 cache [n_ctx, width] at rows
// step[0] .. step[0] + n_tokens - 1; the rows are contiguous, so it is one flat copy.
layout(std430, binding = 0) readonly buffer Src { float src[]; };
layout(std430, binding = 1) writeonly buffer Cache { float16_t cache[]; };
layout(std430, binding = 2) readonly buffer Step { uint step[]; };
layout(push_constant) uniform Push { uint n; uint width; } p;

void main() {
    const uint base = step[0] * p.width;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        cache[base + i] = float16_t(src[i]);
    }
}

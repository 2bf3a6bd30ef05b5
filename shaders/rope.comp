#version 450
#include "common.glsl"

// Rotary position embedding in place on x [n_tokens, n_heads, head_dim] (rope.glsl).
// One invocation per rotated pair; dimensions from rope_dim to head_dim pass through untouched.
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Step { uint step[]; };
#if defined(FREQ_FACTORS)
layout(std430, binding = 2) readonly buffer FF { float freq_factors[]; };
#endif
layout(push_constant) uniform Push { uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; float log2_base; } p;

#include "rope.glsl"

void main() {
    const uint half_dim = p.rope_dim / 2;
    const uint n = p.n_tokens * p.n_heads * half_dim;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint g = gl_GlobalInvocationID.x; g < n; g += stride) {
        const uint i = g % half_dim;
        const uint row = g / half_dim;
        const uvec2 o = row * p.head_dim + rope_pair(i, half_dim);
        const vec2 r = rope_rotate(x[o.x], x[o.y], step[0] + row / p.n_heads, i, p.rope_dim, p.log2_base);
        x[o.x] = r.x;
        x[o.y] = r.y;
    }
}

#version 450
#include "common.glsl"

// Rotary position embedding in place on x [n_tokens, n_heads, head_dim], llama.cpp semantics.
// One invocation per rotated pair; dimensions from rope_dim to head_dim pass through untouched.
// Normal layout rotates (2i, 2i+1), NeoX (i, i + rope_dim/2); theta = pos * base^(-2i/rope_dim),
// divided by freq_factors[i] with FREQ_FACTORS (Llama 3 long-context scaling).
layout(constant_id = 1) const bool NEOX = false;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Step { uint step[]; };
#if defined(FREQ_FACTORS)
layout(std430, binding = 2) readonly buffer FF { float freq_factors[]; };
#endif
layout(push_constant) uniform Push { uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; float log2_base; } p;

void main() {
    const uint half_dim = p.rope_dim / 2;
    const uint n = p.n_tokens * p.n_heads * half_dim;
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint g = gl_GlobalInvocationID.x; g < n; g += stride) {
        const uint i = g % half_dim;
        const uint row = g / half_dim;
        const uint pos = step[0] + row / p.n_heads;
        float theta = float(pos) * exp2(-2.0 * float(i) / float(p.rope_dim) * p.log2_base);
#if defined(FREQ_FACTORS)
        theta /= freq_factors[i];
#endif
        const uint i0 = row * p.head_dim + (NEOX ? i : 2 * i);
        const uint i1 = i0 + (NEOX ? half_dim : 1);
        const float c = cos(theta), s = sin(theta);
        const float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}

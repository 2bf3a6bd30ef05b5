#version 450
#include "common.glsl"

// Constrained generation: logits[i] = -inf where bit i of the token mask is clear, in place,
// before argmax or top-k select from the row. The mask is the grammar library's packed bitmask
// (bit i % 32 of word i / 32 allows token i), written by the host per step; words cover
// at least n tokens, and tokens past the last word are masked.
layout(std430, binding = 0) buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Mask { uint words[]; };
layout(push_constant) uniform Push { uint n; uint n_words; } p;

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        const uint word = i >> 5;
        if (word >= p.n_words || ((words[word] >> (i & 31u)) & 1u) == 0u) {
            logits[i] = uintBitsToFloat(0xff800000u);   // -inf
        }
    }
}

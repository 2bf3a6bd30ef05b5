#version 450
#include "common.glsl"

// Constrained generation: logits[r, i] = -inf where bit i of row r's token mask is clear, in
// place, before argmax or top-k select from the rows (workgroup y = row r). A mask is the grammar
// library's packed bitmask (bit i % 32 of word i / 32 allows token i), ceil(n / 32) words per
// row, written by the host per step; tokens past the buffer's n_words words are masked.
layout(std430, binding = 0) buffer Logits { float logits[]; };
layout(std430, binding = 1) readonly buffer Mask { uint words[]; };
layout(push_constant) uniform Push { uint n; uint n_words; } p;

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    const uint row = gl_WorkGroupID.y;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        const uint word = row * ((p.n + 31) / 32) + (i >> 5);
        if (word >= p.n_words || ((words[word] >> (i & 31u)) & 1u) == 0u) {
            logits[row * p.n + i] = uintBitsToFloat(0xff800000u);   // -inf
        }
    }
}

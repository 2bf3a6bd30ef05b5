#version 450
#include "common.glsl"

// The weighted sum of a mixture-of-experts FFN into the residual stream:
// x[t, i] += sum_j w[t * n_used + j] * y[t * n_used + j, i] over the n_used experts of token t
// (y: the experts' down products, one row per (token, expert) slot). With GATE_SIGMOID each w is
// a gate logit and the weight sigmoid(w): Qwen2-MoE's shared expert (n_used = 1).
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) buffer X { float x[]; };
layout(push_constant) uniform Push { uint n_embd; uint n_used; uint n; } p;

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n * p.n_embd; i += stride) {
        const uint t = i / p.n_embd, c = i % p.n_embd;
        float sum = 0.0;
        for (uint j = 0; j < p.n_used; j++) {
            const uint slot = t * p.n_used + j;
#if defined(GATE_SIGMOID)
            const float weight = 1.0 / (1.0 + exp(-w[slot]));
#else
            const float weight = w[slot];
#endif
            sum += weight * y[slot * p.n_embd + c];
        }
        x[i] += sum;
    }
}

#version 450
#include "common.glsl"

// out[i] = a[i] (op) b[i % b_len]: a + b (with b_len the row length: a bias row added to every
// row) or, with OP_SWIGLU, silu(a) * b, or with OP_GEGLU gelu(a) * b (GELU's tanh form, as
// llama.cpp's ggml_gelu), or with OP_SWIGLU_OAI gpt-oss's clamped SwiGLU (glu_oai.glsl). `out`
// may be bound to the same memory as `a` (in place).
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; uint b_len; } p;

#include "gelu.glsl"
#include "glu_oai.glsl"

float op(float x, float y) {
#if defined(OP_SWIGLU)
    return x / (1.0 + exp(-x)) * y;
#elif defined(OP_GEGLU)
    return gelu(x) * y;
#elif defined(OP_SWIGLU_OAI)
    return glu_oai(x, y);
#else
    return x + y;
#endif
}

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        o[i] = op(a[i], b[i % p.b_len]);
    }
}

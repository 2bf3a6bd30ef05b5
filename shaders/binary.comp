#version 450
#include "common.glsl"

// out[i] = a[i] (op) b[i % b_len]: a + b (with b_len the row length: a bias row added to every
// row) or, with OP_SWIGLU, silu(a) * b, or with OP_GEGLU gelu(a) * b (GELU's tanh form, as
// llama.cpp's ggml_gelu), or with OP_SWIGLU_OAI gpt-oss's clamped SwiGLU (glu_oai.glsl). `out`
// may be bound to the same memory as `a` (in place). With F16, out in f16, each invocation 4 values
// (one uvec2; n a multiple of 4, b_len of n): the cooperative-matrix kernel's input
// (kernels/halves.py's layout for rows of a multiple of 8 values).
#if defined(F16)
layout(std430, binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(std430, binding = 1) readonly buffer B4 { vec4 b4[]; };
layout(std430, binding = 2) writeonly buffer OH { uvec2 oh[]; };
#else
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
#endif
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
#if defined(F16)
    for (uint i = gl_GlobalInvocationID.x; i < p.n / 4; i += stride) {
        const vec4 x = a4[i], y = b4[i % (p.b_len / 4)];
        oh[i] = uvec2(packHalf2x16(vec2(op(x.x, y.x), op(x.y, y.y))), packHalf2x16(vec2(op(x.z, y.z), op(x.w, y.w))));
    }
#else
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        o[i] = op(a[i], b[i % p.b_len]);
    }
#endif
}

#version 450
#include "common.glsl"

// out[i] = f(x[i]): scale (x * s) or GELU (tanh approximation, as llama.cpp).
// `out` may be bound to the same memory as `x` (in place).
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform Push { uint n; float s; } p;

float f(float v) {
#if defined(OP_GELU)
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876;
    const float GELU_COEF_A = 0.044715;
    // tanh saturates long before 15; the clamp keeps exp-based tanh implementations from inf/inf.
    const float t = clamp(SQRT_2_OVER_PI * v * (1.0 + GELU_COEF_A * v * v), -15.0, 15.0);
    return 0.5 * v * (1.0 + tanh(t));
#else
    return v * p.s;
#endif
}

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
        o[i] = f(x[i]);
    }
}

#version 450
#if defined(X8)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"
#include "reduce.glsl"
#include "x8.glsl"

// One workgroup per row: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight (with X8 in 8-bit
// blocks, for rows of a multiple of 32 values: store4 below; with F32 as well, in f32 into out and
// in blocks into the fourth buffer). With GATHER,
// out[r] = that of x[rows[r]] (the output norm of a batched pass, over the tokens that get logits).
// With ADD, out[r] += that instead (a post norm's residual add: Gemma's). With F16 (and no X8), out
// in f16, 4 values a uvec2: the cooperative-matrix kernel's input (kernels/halves.py's layout for
// rows of a multiple of 8 values), with no conversion dispatch between.
// Rows whose length is a multiple of 4 are read as 4-vectors; each invocation keeps its first
// 4-vector (a whole row of up to 4 x workgroup-size values) and that 4-vector's weight in
// registers, the weight loaded before the reduction so that its memory latency overlaps it
// (decode runs one row: a chain of dependent loads would be the kernel's whole cost).
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
#if defined(F16) && !defined(X8)
layout(std430, binding = 1) writeonly buffer OH { uvec2 oh[]; };
#endif
#if defined(ADD)
#define OUT_ACCESS
#else
#define OUT_ACCESS writeonly
#endif
layout(std430, binding = 1) OUT_ACCESS buffer O { float o[]; };
layout(std430, binding = 1) OUT_ACCESS buffer O4 { vec4 o4[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 2) readonly buffer W4 { vec4 w4[]; };
#if defined(GATHER)
layout(std430, binding = 3) readonly buffer Rows { uint rows[]; };
#endif
layout(push_constant) uniform Push { uint cols; float eps; } p;

#if defined(X8)
// The output in x8.glsl's 8-bit blocks of 32 values, for the 8-bit mat-vec kernels (rows are a
// multiple of 32 values and the workgroup of whole subgroups: x8_store.glsl's lanes).
#if defined(F32)
layout(std430, binding = 3) writeonly buffer Q { uint q8[]; };
#else
layout(std430, binding = 1) writeonly buffer Q { uint q8[]; };
#endif
#include "x8_store.glsl"

void store4(uint i4, vec4 v) {
#if defined(F32)
    o4[i4] = v;
#endif
    store_x8(i4, v, p.cols, 0.0);
}
#elif defined(F16)   // (F16 rows are a multiple of 8 values: only store4)
void store4(uint i4, vec4 v) { oh[i4] = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
#elif defined(ADD)
void store4(uint i4, vec4 v) { o4[i4] += v; }
void store1(uint i, float v) { o[i] += v; }
#else
void store4(uint i4, vec4 v) { o4[i4] = v; }
void store1(uint i, float v) { o[i] = v; }
#endif

void main() {
    const uint tid = gl_LocalInvocationID.x, size = gl_WorkGroupSize.x;
#if defined(GATHER)
    const uint in_row = rows[gl_WorkGroupID.x];
#else
    const uint in_row = gl_WorkGroupID.x;
#endif
    if (p.cols % 4 == 0) {
        const uint n4 = p.cols / 4, base = in_row * n4, out_base = gl_WorkGroupID.x * n4;
        const bool first = tid < n4;
        const vec4 x0 = first ? x4[base + tid] : vec4(0.0);
        const vec4 w0 = first ? w4[tid] : vec4(0.0);
        float sum = dot(x0, x0);
        for (uint c = tid + size; c < n4; c += size) {
            const vec4 v = x4[base + c];
            sum += dot(v, v);
        }
        const float inv = inversesqrt(workgroup_sum(sum) / float(p.cols) + p.eps);
        if (first) {
            store4(out_base + tid, x0 * inv * w0);
        }
        for (uint c = tid + size; c < n4; c += size) {
            store4(out_base + c, x4[base + c] * inv * w4[c]);
        }
        return;
    }
#if !defined(X8) && !defined(F16)   // (X8 rows are a multiple of 32 values, F16 ones of 8)
    const uint base = in_row * p.cols, out_base = gl_WorkGroupID.x * p.cols;
    float sum = 0.0;
    for (uint c = tid; c < p.cols; c += size) {
        const float v = x[base + c];
        sum += v * v;
    }
    const float inv = inversesqrt(workgroup_sum(sum) / float(p.cols) + p.eps);
    for (uint c = tid; c < p.cols; c += size) {
        store1(out_base + c, x[base + c] * inv * w[c]);
    }
#endif
}

#version 450
#include "common.glsl"

// RoPE on q and k and the KV-cache append in one dispatch (rope.glsl for the rotation).
// q f32 [n_tokens, n_head, head_dim] is rotated in place; k and v f32 [n_tokens, n_head_kv *
// head_dim] go as f16 to cache rows step[0] + t, k rotated (dimensions past rope_dim copied),
// k itself left as it was. One workgroup per (head, token): gl_WorkGroupID.x counts the q heads,
// then the k heads, then the v heads, gl_WorkGroupID.y is the token; the heads share no data,
// so there is no barrier, and every branch below is uniform across the workgroup.
layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KCache { float16_t k_cache[]; };
layout(std430, binding = 4) writeonly buffer VCache { float16_t v_cache[]; };
layout(std430, binding = 5) readonly buffer Step { uint step[]; };
#if defined(FREQ_FACTORS)
layout(std430, binding = 6) readonly buffer FF { float freq_factors[]; };
#endif
layout(push_constant) uniform Push { uint n_head; uint n_head_kv; uint head_dim; uint rope_dim; float log2_base; } p;

#include "rope.glsl"

void main() {
    const uint head = gl_WorkGroupID.x;
    const uint t = gl_WorkGroupID.y;
    const uint pos = step[0] + t;
    const uint half_dim = p.rope_dim / 2;
    const uint lane = gl_LocalInvocationID.x;
    const uint size = gl_WorkGroupSize.x;
    if (head < p.n_head) {
        const uint base = (t * p.n_head + head) * p.head_dim;
        for (uint i = lane; i < half_dim; i += size) {
            const uvec2 o = base + rope_pair(i, half_dim);
            const vec2 r = rope_rotate(q[o.x], q[o.y], pos, i, p.rope_dim, p.log2_base);
            q[o.x] = r.x;
            q[o.y] = r.y;
        }
        return;
    }
    const uint width = p.n_head_kv * p.head_dim;
    const uint kv_head = head - p.n_head;
    if (kv_head < p.n_head_kv) {
        const uint src = t * width + kv_head * p.head_dim;
        const uint dst = pos * width + kv_head * p.head_dim;
        for (uint i = lane; i < half_dim; i += size) {
            const uvec2 o = rope_pair(i, half_dim);
            const vec2 r = rope_rotate(k[src + o.x], k[src + o.y], pos, i, p.rope_dim, p.log2_base);
            k_cache[dst + o.x] = float16_t(r.x);
            k_cache[dst + o.y] = float16_t(r.y);
        }
        for (uint d = p.rope_dim + lane; d < p.head_dim; d += size) {
            k_cache[dst + d] = float16_t(k[src + d]);
        }
        return;
    }
    const uint offset = (kv_head - p.n_head_kv) * p.head_dim;
    for (uint d = lane; d < p.head_dim; d += size) {
        v_cache[pos * width + offset + d] = float16_t(v[t * width + offset + d]);
    }
}

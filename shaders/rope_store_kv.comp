#version 450
#include "common.glsl"

// RoPE on q and k and the KV-cache append in one dispatch (rope.glsl for the rotation).
// q f32 [n_tokens, n_head, head_dim] is rotated in place; k and v f32 [n_tokens, n_head_kv *
// head_dim] go to the paged cache (kv_cache.glsl) at position tokens[t].y of the sequence in
// slot tokens[t].x, k rotated (dimensions past rope_dim copied), k itself left as it was.
// One workgroup per (head, token): gl_WorkGroupID.x counts the q heads, then the k heads, then
// the v heads, gl_WorkGroupID.y is the token; the heads share no data, so there is no barrier,
// and every branch below is uniform across the workgroup. The cache holds f16, or with KV_Q8
// q8_0-like groups of 32 values (llama.cpp's quantize_row_q8_0: scale = max |x| / 127, values
// round(x / scale)): an invocation takes a whole group, computing its rotated values twice
// (once for the scale, once to store) rather than sharing them through memory. With QKV_BIAS
// (Qwen2, gpt-oss) the projections' biases are added to q, k and v as they are read (q keeps
// them). With QK_NORM (Qwen3, Gemma 3) each q and k head is then RMS-normalised over head_dim and
// scaled by the q_norm or k_norm weight (llama.cpp's per-head norm before RoPE): the head's sum
// of squares is one workgroup_sum, in the head's uniform branch. Either way the separate
// dispatches (bias adds, norms) and their barrier are gone.
#define KV_TABLE_BINDING 6
#include "kv_cache.glsl"

layout(std430, binding = 0) buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) writeonly buffer KCache { KV_SCALAR k_cache[]; };
layout(std430, binding = 4) writeonly buffer VCache { KV_SCALAR v_cache[]; };
layout(std430, binding = 5) readonly buffer Step { uvec2 tokens[]; };   // (slot, position) per token
#if defined(FREQ_FACTORS)
layout(std430, binding = 7) readonly buffer FF { float freq_factors[]; };
#define SCALE_BINDING 8
#else
#define SCALE_BINDING 7
#endif
#if defined(KV_Q8)
layout(std430, binding = SCALE_BINDING) writeonly buffer KS { float16_t k_scale[]; };
layout(std430, binding = SCALE_BINDING + 1) writeonly buffer VS { float16_t v_scale[]; };
#define NORM_BINDING (SCALE_BINDING + 2)
#else
#define NORM_BINDING SCALE_BINDING
#endif
layout(push_constant) uniform Push {
    uint n_head; uint n_head_kv; uint head_dim; uint rope_dim; float log2_base; uint table_stride;
#if defined(QK_NORM)
    float eps;
#endif
} p;

#define NEOX_CONSTANT_ID 1
#include "rope.glsl"

#if defined(QKV_BIAS)
#if defined(QK_NORM)
#define BIAS_BINDING (NORM_BINDING + 2)
#else
#define BIAS_BINDING NORM_BINDING
#endif
#endif
#define Q_WIDTH (p.n_head * p.head_dim)
#define KV_WIDTH (p.n_head_kv * p.head_dim)
#include "qkv_in.glsl"

// The same normalised, as RoPE takes them.
#if defined(QK_NORM)
#include "reduce.glsl"
layout(std430, binding = NORM_BINDING) readonly buffer QN { float q_norm[]; };
layout(std430, binding = NORM_BINDING + 1) readonly buffer KN { float k_norm[]; };
float scale = 1.0;   // 1 / rms of the workgroup's head (main sets it)

// 1 / rms of the q head at src (from_q) or the k head; every invocation of the workgroup calls it.
float inv_rms(bool from_q, uint src) {
    float sum = 0.0;
    for (uint d = gl_LocalInvocationID.x; d < p.head_dim; d += gl_WorkGroupSize.x) {
        const float x = from_q ? q_in(src, d) : k_in(src, d);
        sum += x * x;
    }
    return inversesqrt(workgroup_sum(sum) / float(p.head_dim) + p.eps);
}
float q_at(uint base, uint d) { return q_in(base, d) * scale * q_norm[d]; }
float k_at(uint src, uint d) { return k_in(src, d) * scale * k_norm[d]; }
#else
float q_at(uint base, uint d) { return q_in(base, d); }
float k_at(uint src, uint d) { return k_in(src, d); }
#endif

#if defined(KV_Q8)
// Value d of k's head at src, rotated when d < rope_dim.
float k_rotated(uint src, uint d, uint pos) {
    if (d >= p.rope_dim) {
        return k_at(src, d);
    }
    return rope_value(k_at(src, d), k_at(src, rope_partner(d, p.rope_dim / 2)), d, pos, p.rope_dim, p.log2_base);
}

// One 32-value group of a head: from k (rotated) or v at src to the cache at dst.
void store_group(bool is_k, uint src, uint dst, uint pos) {
    float amax = 0.0;
    for (uint j = 0; j < KV_Q8_GROUP; j++) {
        amax = max(amax, abs(is_k ? k_rotated(src, dst % p.head_dim + j, pos) : v_in(src, dst % p.head_dim + j)));
    }
    const float d = amax / 127.0;
    const float id = d != 0.0 ? 1.0 / d : 0.0;
    for (uint j = 0; j < KV_Q8_GROUP; j++) {
        const float x = is_k ? k_rotated(src, dst % p.head_dim + j, pos) : v_in(src, dst % p.head_dim + j);
        const int8_t qv = int8_t(round(x * id));
        if (is_k) {
            k_cache[dst + j] = qv;
        } else {
            v_cache[dst + j] = qv;
        }
    }
    if (is_k) {
        k_scale[dst / KV_Q8_GROUP] = float16_t(d);
    } else {
        v_scale[dst / KV_Q8_GROUP] = float16_t(d);
    }
}
#endif

void main() {
    const uint head = gl_WorkGroupID.x;
    const uint t = gl_WorkGroupID.y;
    const uint pos = tokens[t].y;
    const uint half_dim = p.rope_dim / 2;
    const uint lane = gl_LocalInvocationID.x;
    const uint size = gl_WorkGroupSize.x;
    if (head < p.n_head) {
        const uint base = (t * p.n_head + head) * p.head_dim;
#if defined(QK_NORM)
        scale = inv_rms(true, base);   // its barrier: every read of the head before any write
#endif
#if defined(QK_NORM) || defined(QKV_BIAS)
        for (uint d = p.rope_dim + lane; d < p.head_dim; d += size) {
            q[base + d] = q_at(base, d);
        }
#endif
        for (uint i = lane; i < half_dim; i += size) {
            const uvec2 o = rope_pair(i, half_dim);
            const vec2 r = rope_rotate(q_at(base, o.x), q_at(base, o.y), pos, i, p.rope_dim, p.log2_base);
            q[base + o.x] = r.x;
            q[base + o.y] = r.y;
        }
        return;
    }
    const uint width = p.n_head_kv * p.head_dim;
    const uint row = kv_row(tokens[t].x, pos, p.table_stride);
    const uint kv_head = head - p.n_head;
    const bool is_k = kv_head < p.n_head_kv;
    const uint offset = (is_k ? kv_head : kv_head - p.n_head_kv) * p.head_dim;
    const uint src = t * width + offset, dst = row * width + offset;
#if defined(QK_NORM)
    if (is_k) {
        scale = inv_rms(false, src);
    }
#endif
#if defined(KV_Q8)
    for (uint g = lane; g < p.head_dim / KV_Q8_GROUP; g += size) {
        store_group(is_k, src, dst + g * KV_Q8_GROUP, pos);
    }
#else
    if (is_k) {
        for (uint i = lane; i < half_dim; i += size) {
            const uvec2 o = rope_pair(i, half_dim);
            const vec2 r = rope_rotate(k_at(src, o.x), k_at(src, o.y), pos, i, p.rope_dim, p.log2_base);
            k_cache[dst + o.x] = float16_t(r.x);
            k_cache[dst + o.y] = float16_t(r.y);
        }
        for (uint d = p.rope_dim + lane; d < p.head_dim; d += size) {
            k_cache[dst + d] = float16_t(k_at(src, d));
        }
        return;
    }
    for (uint d = lane; d < p.head_dim; d += size) {
        v_cache[dst + d] = float16_t(v_in(src, d));
    }
#endif
}

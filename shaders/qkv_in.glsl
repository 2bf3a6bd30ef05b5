// The Q/K/V projections' outputs as RoPE reads them (rope_store_kv.comp, attention.comp with
// ROPE): value d of the q head that starts at base, of the k or v head at src (in a token's row
// of all KV heads); with QKV_BIAS (Qwen2, gpt-oss) the projections' biases added as they are
// read. The includer declares q[], k[] and v[] (f32), defines Q_WIDTH and KV_WIDTH (a token's
// q and k values: n_head and n_head_kv heads) and, with QKV_BIAS, BIAS_BINDING.
#if defined(QKV_BIAS)
layout(std430, binding = BIAS_BINDING) readonly buffer BQ { float bias_q[]; };       // [Q_WIDTH]
layout(std430, binding = BIAS_BINDING + 1) readonly buffer BK { float bias_k[]; };   // [KV_WIDTH]
layout(std430, binding = BIAS_BINDING + 2) readonly buffer BV { float bias_v[]; };
float q_in(uint base, uint d) { return q[base + d] + bias_q[base % Q_WIDTH + d]; }
float k_in(uint src, uint d) { return k[src + d] + bias_k[src % KV_WIDTH + d]; }
float v_in(uint src, uint d) { return v[src + d] + bias_v[src % KV_WIDTH + d]; }
#else
float q_in(uint base, uint d) { return q[base + d]; }
float k_in(uint src, uint d) { return k[src + d]; }
float v_in(uint src, uint d) { return v[src + d]; }
#endif

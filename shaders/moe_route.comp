#version 450
#include "common.glsl"
#include "reduce.glsl"

// Mixture-of-experts routing, one workgroup per token t: the n_used best of the token's n_expert
// router logits (ties to the lower expert), best first, written as expert ids
// ids[t * n_used + j] and weights w[t * n_used + j] (llama.cpp's build_moe_ffn):
//   softmax_chosen = 0: w = softmax over all experts, taken at the chosen ones (Qwen3-MoE);
//   softmax_chosen = 1: w = softmax over the chosen logits only (gpt-oss);
//   norm = 1: w /= max(sum of the chosen w, 2^-14) (renormalised to sum 1).
// With ROUTER_BIAS (gpt-oss) the router's bias is added to the logits first.
// The token's logits are loaded once, PER_THREAD per invocation (experts tid, tid + WG, ...), and
// each round of the selection is one workgroup_best over the ones not yet chosen: a round reads
// no memory but the reduction's, where reloading the logits each round had cost the latency of
// a read per round (an H200 took 11 us per token over 128 experts).
layout(constant_id = 1) const uint PER_THREAD = 8;   // >= ceil(n_expert / workgroup size)
layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Weights { float weights[]; };
#if defined(ROUTER_BIAS)
layout(std430, binding = 3) readonly buffer Bias { float bias[]; };   // [n_expert], added to every token's logits
#define LOGIT(e) (logits[base + (e)] + bias[e])
#else
#define LOGIT(e) logits[base + (e)]
#endif
layout(push_constant) uniform Push { uint n_expert; uint n_used; uint softmax_chosen; uint norm; } p;

const uint MAX_USED = 32;   // models/config.py's MAX_EXPERTS_USED
shared uint chosen[MAX_USED];
shared float chosen_logit[MAX_USED];

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint base = t * p.n_expert, tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    float mine[PER_THREAD];
    uint taken = 0;   // bit i: expert tid + i * wg chosen (or absent)
    for (uint i = 0; i < PER_THREAD; i++) {
        const uint e = tid + i * wg;
        mine[i] = e < p.n_expert ? LOGIT(e) : NEG_INF;
        taken |= e < p.n_expert ? 0u : 1u << i;
    }
    for (uint j = 0; j < p.n_used; j++) {
        float v = NEG_INF;
        uint index = 0xFFFFFFFFu;
        for (uint i = 0; i < PER_THREAD; i++) {
            if ((taken & (1u << i)) == 0 && (mine[i] > v || index == 0xFFFFFFFFu)) {
                v = mine[i];
                index = tid + i * wg;
            }
        }
        workgroup_best(v, index);
        if (index % wg == tid) {
            taken |= 1u << (index / wg);
        }
        if (tid == 0) {
            chosen[j] = index;
            chosen_logit[j] = v;
        }
    }
    barrier();
    // The best logit is chosen[0]'s: the softmax's maximum either way.
    const float top = chosen_logit[0];
    float total = 0.0;
    if (p.softmax_chosen != 0) {
        for (uint j = 0; j < p.n_used; j++) {
            total += exp(chosen_logit[j] - top);
        }
    } else {
        float part = 0.0;
        for (uint i = 0; i < PER_THREAD; i++) {
            part += tid + i * wg < p.n_expert ? exp(mine[i] - top) : 0.0;
        }
        total = workgroup_sum(part);
    }
    float chosen_sum = 0.0;
    for (uint j = 0; j < p.n_used; j++) {
        chosen_sum += exp(chosen_logit[j] - top) / total;
    }
    const float scale = p.norm != 0 ? 1.0 / max(chosen_sum, 6.103515625e-5) : 1.0;
    for (uint j = tid; j < p.n_used; j += wg) {
        ids[t * p.n_used + j] = chosen[j];
        weights[t * p.n_used + j] = exp(chosen_logit[j] - top) / total * scale;
    }
}

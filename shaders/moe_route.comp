#version 450
#include "common.glsl"
#include "reduce.glsl"

// Mixture-of-experts routing, one workgroup per token t: the n_used best of the token's n_expert
// router logits (ties to the lower expert), best first, written as expert ids
// ids[t * n_used + j] and weights w[t * n_used + j] (llama.cpp's build_moe_ffn):
//   softmax_chosen = 0: w = softmax over all experts, taken at the chosen ones (Qwen3-MoE);
//   softmax_chosen = 1: w = softmax over the chosen logits only (gpt-oss);
//   norm = 1: w /= max(sum of the chosen w, 2^-14) (renormalised to sum 1).
// Each round of the selection is one workgroup_best over the experts not yet chosen.
layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Weights { float weights[]; };
layout(push_constant) uniform Push { uint n_expert; uint n_used; uint softmax_chosen; uint norm; } p;

const uint MAX_USED = 32;   // models/config.py's MAX_EXPERTS_USED
shared uint chosen[MAX_USED];
shared float chosen_logit[MAX_USED];

bool is_chosen(uint e, uint count) {
    for (uint j = 0; j < count; j++) {
        if (chosen[j] == e) {
            return true;
        }
    }
    return false;
}

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint base = t * p.n_expert, tid = gl_LocalInvocationID.x;
    for (uint j = 0; j < p.n_used; j++) {
        float v = NEG_INF;
        uint index = 0xFFFFFFFFu;
        for (uint e = tid; e < p.n_expert; e += gl_WorkGroupSize.x) {
            const float l = logits[base + e];
            if (!is_chosen(e, j) && (l > v || index == 0xFFFFFFFFu)) {
                v = l;
                index = e;
            }
        }
        workgroup_best(v, index);
        if (tid == 0) {
            chosen[j] = index;
            chosen_logit[j] = v;
        }
        barrier();
    }
    // The best logit is chosen[0]'s: the softmax's maximum either way.
    const float top = chosen_logit[0];
    float total = 0.0;
    if (p.softmax_chosen != 0) {
        for (uint j = 0; j < p.n_used; j++) {
            total += exp(chosen_logit[j] - top);
        }
    } else {
        float part = 0.0;
        for (uint e = tid; e < p.n_expert; e += gl_WorkGroupSize.x) {
            part += exp(logits[base + e] - top);
        }
        total = workgroup_sum(part);
    }
    float chosen_sum = 0.0;
    for (uint j = 0; j < p.n_used; j++) {
        chosen_sum += exp(chosen_logit[j] - top) / total;
    }
    const float scale = p.norm != 0 ? 1.0 / max(chosen_sum, 6.103515625e-5) : 1.0;
    for (uint j = tid; j < p.n_used; j += gl_WorkGroupSize.x) {
        ids[t * p.n_used + j] = chosen[j];
        weights[t * p.n_used + j] = exp(chosen_logit[j] - top) / total * scale;
    }
}

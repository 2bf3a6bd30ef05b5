#version 450
#include "common.glsl"
#include "reduce.glsl"

// One stage of top-k: workgroup c takes slots [c * CHUNK, (c + 1) * CHUNK) of the input
// (CHUNK = workgroup size * PER_THREAD) and writes its k best (value, id) pairs, sorted, at
// [c * k, (c + 1) * k) of the output. Stages repeat until one chunk is left. Without HAS_IDS the
// id of a slot is the slot itself (the first stage over a row of logits). Ties go to the lower
// slot; slot order follows id order among equal values at every stage, so that is the lower id.
layout(constant_id = 1) const uint PER_THREAD = 16;
layout(std430, binding = 0) readonly buffer InVals { float in_vals[]; };
layout(std430, binding = 1) readonly buffer InIds { uint in_ids[]; };
layout(std430, binding = 2) writeonly buffer OutIds { uint out_ids[]; };
layout(std430, binding = 3) writeonly buffer OutVals { float out_vals[]; };
layout(push_constant) uniform Push { uint n; uint k; uint has_ids; } p;

void main() {
    const uint first = gl_WorkGroupID.x * gl_WorkGroupSize.x * PER_THREAD + gl_LocalInvocationID.x;
    float v[PER_THREAD];
    uint live = 0;  // bit e: element e of this invocation is still a candidate
    for (uint e = 0; e < PER_THREAD; e++) {
        const uint slot = first + e * gl_WorkGroupSize.x;
        v[e] = slot < p.n ? in_vals[slot] : NEG_INF;
        live |= slot < p.n ? 1u << e : 0u;
    }
    for (uint r = 0; r < p.k; r++) {
        float best = NEG_INF;
        uint best_slot = 0xFFFFFFFFu;
        for (uint e = 0; e < PER_THREAD; e++) {
            // ascending e is ascending slot: strictly greater keeps the lower slot
            if ((live & (1u << e)) != 0 && (v[e] > best || best_slot == 0xFFFFFFFFu)) {
                best = v[e];
                best_slot = first + e * gl_WorkGroupSize.x;
            }
        }
        workgroup_best(best, best_slot);
        const uint e = (best_slot - first) / gl_WorkGroupSize.x;
        if (best_slot != 0xFFFFFFFFu && best_slot >= first && (best_slot - first) % gl_WorkGroupSize.x == 0
            && e < PER_THREAD) {
            live &= ~(1u << e);
        }
        if (gl_LocalInvocationID.x == 0) {
            const uint out_slot = gl_WorkGroupID.x * p.k + r;
            out_vals[out_slot] = best;
            out_ids[out_slot] = best_slot == 0xFFFFFFFFu ? best_slot : (p.has_ids != 0 ? in_ids[best_slot] : best_slot);
        }
    }
}

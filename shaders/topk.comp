#version 450
#include "common.glsl"
#include "reduce.glsl"

// One stage of top-k over rows (workgroup y = row): workgroup x = c takes slots
// [c * CHUNK, (c + 1) * CHUNK) of its row (CHUNK = workgroup size * PER_THREAD) and writes its
// k best (value, id) pairs, best first, at [c * k, (c + 1) * k) of the row's output (rows of
// gl_NumWorkGroups.x * k). Stages repeat until one chunk per row is left. Without HAS_IDS the id
// of a slot is the slot itself (the first stage over logits). Ties go to the lower slot; slot
// order follows id order among equal values at every stage, so that is the lower id.
// Each invocation keeps its values in registers and its own best among those still in play;
// a round picks the workgroup's best, whose owner writes it out and looks for its next best.
layout(constant_id = 1) const uint PER_THREAD = 16;
layout(std430, binding = 0) readonly buffer InVals { float in_vals[]; };
layout(std430, binding = 1) readonly buffer InIds { uint in_ids[]; };
layout(std430, binding = 2) writeonly buffer OutIds { uint out_ids[]; };
layout(std430, binding = 3) writeonly buffer OutVals { float out_vals[]; };
layout(push_constant) uniform Push { uint n; uint k; uint has_ids; } p;

const uint NONE = 0xFFFFFFFFu;
const uint WG = gl_WorkGroupSize.x;

void main() {
    const uint first = gl_WorkGroupID.x * WG * PER_THREAD + gl_LocalInvocationID.x;
    const uint in_base = gl_WorkGroupID.y * p.n;
    const uint out_base = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * p.k;
    float v[PER_THREAD];
    uint id[PER_THREAD];
    uint64_t live = 0;  // bit e: element e of this invocation is still in play (PER_THREAD <= 64)
    for (uint e = 0; e < PER_THREAD; e++) {
        const uint slot = first + e * WG;
        const bool here = slot < p.n;
        v[e] = here ? in_vals[in_base + slot] : NEG_INF;
        id[e] = here && p.has_ids != 0 ? in_ids[in_base + slot] : slot;
        live |= here ? uint64_t(1) << e : uint64_t(0);
    }
    // This invocation's best element still in play (value, id, element), found by scans with
    // constant indices only: a register array indexed at run time would spill to memory.
    float mine_v;
    uint mine_id, mine = NONE;
    for (uint r = 0; r < p.k; r++) {
        if (mine == NONE) {
            for (uint e = 0; e < PER_THREAD; e++) {  // ascending e is ascending slot: strictly greater keeps the lower
                if ((live & (uint64_t(1) << e)) != 0 && (mine == NONE || v[e] > mine_v)) {
                    mine = e;
                    mine_v = v[e];
                    mine_id = id[e];
                }
            }
        }
        float best = mine == NONE ? NEG_INF : mine_v;
        uint best_slot = mine == NONE ? NONE : first + mine * WG;
        workgroup_best(best, best_slot);
        if (mine != NONE && best_slot == first + mine * WG) {
            out_vals[out_base + r] = mine_v;
            out_ids[out_base + r] = mine_id;
            live &= ~(uint64_t(1) << mine);
            mine = NONE;
        } else if (best_slot == NONE && gl_LocalInvocationID.x == 0) {  // fewer than k in this chunk
            out_vals[out_base + r] = NEG_INF;
            out_ids[out_base + r] = NONE;
        }
    }
}

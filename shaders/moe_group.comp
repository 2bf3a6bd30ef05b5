#version 450
#include "common.glsl"

// Groups a pass's slots (token t, its j-th chosen expert: slot t * n_used + j) by expert for the
// expert mat-vecs of a prefill chunk, so that one workgroup applies each load of an expert's
// weights to up to `cols` slots (mul_mat_vec.comp with EXPERT_TILES). One workgroup: counts the
// slots of every expert, lays the experts' slots out one expert after another (order within an
// expert does not matter: every slot is a column of its own) and cuts each expert's run into
// tiles of at most `cols` slots. Output: slots[n_slots] the slots by expert, then tiles[max_tiles]
// of (expert, first index in slots, count); tiles past the last have count 0.
layout(std430, binding = 0) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 1) writeonly buffer Tiles { uint out_[]; };
layout(push_constant) uniform Push { uint n_slots; uint n_expert; uint cols; uint max_tiles; } p;

const uint MAX_EXPERTS = 512;   // models/config.py's MAX_EXPERTS
shared uint count[MAX_EXPERTS];
shared uint start[MAX_EXPERTS];
shared uint first_tile[MAX_EXPERTS];
shared uint n_tiles;

void main() {
    const uint tid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    for (uint e = tid; e < p.n_expert; e += wg) {
        count[e] = 0;
    }
    barrier();
    for (uint s = tid; s < p.n_slots; s += wg) {
        atomicAdd(count[ids[s]], 1u);
    }
    barrier();
    if (tid == 0) {
        uint slot = 0, tile = 0;
        for (uint e = 0; e < p.n_expert; e++) {
            start[e] = slot;
            first_tile[e] = tile;
            slot += count[e];
            tile += (count[e] + p.cols - 1) / p.cols;
        }
        n_tiles = tile;
    }
    barrier();
    for (uint e = tid; e < p.n_expert; e += wg) {
        for (uint i = 0; i < (count[e] + p.cols - 1) / p.cols; i++) {
            const uint t = p.n_slots + 3 * (first_tile[e] + i);
            out_[t] = e;
            out_[t + 1] = start[e] + i * p.cols;
            out_[t + 2] = min(p.cols, count[e] - i * p.cols);
        }
        count[e] = 0;    // from here: the slots placed so far
    }
    barrier();
    for (uint t = n_tiles + tid; t < p.max_tiles; t += wg) {
        out_[p.n_slots + 3 * t + 2] = 0;
    }
    for (uint s = tid; s < p.n_slots; s += wg) {
        const uint e = ids[s];
        out_[start[e] + atomicAdd(count[e], 1u)] = s;
    }
}

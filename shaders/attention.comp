#version 450
#include "common.glsl"

// Causal grouped-query attention over f16 K/V caches [n_ctx, n_head_kv, HEAD_DIM] for queries
// q [n_tokens, n_head, HEAD_DIM] at positions step[0] + t.
// Workgroup (s, y, t): token t, kv head g = y / row_groups, its query heads
// g * group + (y % row_groups) * ROWS + r (r < ROWS), and the positions of split s:
// [s * chunk, min((s + 1) * chunk, step[0] + t + 1)).
// Positions go in tiles of one per invocation: each invocation scores its position against all
// ROWS heads (one K row read serves the GQA group), then every invocation folds the tile's V rows
// into its own head dimensions with an online softmax (running max m, running sum l).
// With SPLIT it writes the unnormalized partial (acc, m, l) for attention_merge (flash-decoding);
// otherwise the finished output.
layout(constant_id = 1) const uint HEAD_DIM = 128;
layout(constant_id = 2) const uint ROWS = 1;
const uint WG = gl_WorkGroupSize.x;
const uint DIMS = (HEAD_DIM + WG - 1) / WG;  // head dimensions per invocation
const float NO_SCORE = -3.0e38;  // finite "minus infinity": exp(NO_SCORE - m) is 0 without inf arithmetic

layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { f16vec4 k4[]; };
layout(std430, binding = 2) readonly buffer V { float16_t v[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };
#if defined(SPLIT)
layout(std430, binding = 4) writeonly buffer PartO { float part_o[]; };
layout(std430, binding = 5) writeonly buffer PartML { vec2 part_ml[]; };
#else
layout(std430, binding = 4) writeonly buffer O { float o[]; };
#endif
layout(push_constant) uniform Push { uint n_head; uint n_head_kv; uint group; uint row_groups; uint chunk; float scale; } p;

shared float q_sh[ROWS * HEAD_DIM];
shared float s_sh[ROWS * WG];
shared float p_sh[ROWS * WG];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint split = gl_WorkGroupID.x, t = gl_WorkGroupID.z;
    const uint g = gl_WorkGroupID.y / p.row_groups;
    const uint first_in_group = (gl_WorkGroupID.y % p.row_groups) * ROWS;
    const uint rows = min(ROWS, p.group - first_in_group);
    const uint head0 = g * p.group + first_in_group;
    const uint begin = split * p.chunk;
    const uint end = min(begin + p.chunk, step[0] + t + 1);
    const uint kv_stride = p.n_head_kv * HEAD_DIM;

    for (uint i = tid; i < ROWS * HEAD_DIM; i += WG) {
        q_sh[i] = i / HEAD_DIM < rows ? q[(t * p.n_head + head0) * HEAD_DIM + i] * p.scale : 0.0;
    }
    barrier();

    float m[ROWS], l[ROWS], acc[ROWS * DIMS];
    for (uint r = 0; r < ROWS; r++) {
        m[r] = NO_SCORE;
        l[r] = 0.0;
        for (uint dd = 0; dd < DIMS; dd++) {
            acc[r * DIMS + dd] = 0.0;
        }
    }
    for (uint tile = begin; tile < end; tile += WG) {
        const uint n_here = min(WG, end - tile);
        if (tid < n_here) {
            float dots[ROWS];
            for (uint r = 0; r < ROWS; r++) {
                dots[r] = 0.0;
            }
            const uint k_base = ((tile + tid) * kv_stride + g * HEAD_DIM) / 4;
            for (uint d4 = 0; d4 < HEAD_DIM / 4; d4++) {
                const vec4 kk = vec4(k4[k_base + d4]);
                for (uint r = 0; r < ROWS; r++) {
                    const uint qi = r * HEAD_DIM + 4 * d4;
                    dots[r] += dot(kk, vec4(q_sh[qi], q_sh[qi + 1], q_sh[qi + 2], q_sh[qi + 3]));
                }
            }
            for (uint r = 0; r < ROWS; r++) {
                s_sh[r * WG + tid] = dots[r];
            }
        }
        barrier();
        float alpha[ROWS];
        for (uint r = 0; r < ROWS; r++) {
            float tile_max = m[r];
            for (uint j = 0; j < n_here; j++) {
                tile_max = max(tile_max, s_sh[r * WG + j]);
            }
            alpha[r] = exp(m[r] - tile_max);
            m[r] = tile_max;
            if (tid < n_here) {
                p_sh[r * WG + tid] = exp(s_sh[r * WG + tid] - tile_max);
            }
        }
        barrier();
        for (uint r = 0; r < ROWS; r++) {
            l[r] *= alpha[r];
            for (uint dd = 0; dd < DIMS; dd++) {
                acc[r * DIMS + dd] *= alpha[r];
            }
        }
        for (uint j = 0; j < n_here; j++) {
            const uint v_base = (tile + j) * kv_stride + g * HEAD_DIM;
            for (uint r = 0; r < ROWS; r++) {
                l[r] += p_sh[r * WG + j];
            }
            for (uint dd = 0; dd < DIMS; dd++) {
                const uint d = tid + dd * WG;
                const float vv = d < HEAD_DIM ? float(v[v_base + d]) : 0.0;
                for (uint r = 0; r < ROWS; r++) {
                    acc[r * DIMS + dd] += p_sh[r * WG + j] * vv;
                }
            }
        }
        // No barrier needed here: the next tile writes s_sh (read before the last barrier) and
        // writes p_sh only after its first barrier, which every invocation reaches after this loop.
    }

    for (uint r = 0; r < rows; r++) {
        const uint row = t * p.n_head + head0 + r;
#if defined(SPLIT)
        const uint part = row * gl_NumWorkGroups.x + split;
        for (uint dd = 0; dd < DIMS; dd++) {
            const uint d = tid + dd * WG;
            if (d < HEAD_DIM) {
                part_o[part * HEAD_DIM + d] = acc[r * DIMS + dd];
            }
        }
        if (tid == 0) {
            part_ml[part] = vec2(m[r], l[r]);
        }
#else
        for (uint dd = 0; dd < DIMS; dd++) {
            const uint d = tid + dd * WG;
            if (d < HEAD_DIM) {
                o[row * HEAD_DIM + d] = acc[r * DIMS + dd] / l[r];
            }
        }
#endif
    }
}

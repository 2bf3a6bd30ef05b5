// Matrix x vector (decode), for up to NUM_COLS vectors at once (a few tokens or sequences: the
// weights are read once for all of them): y[c, y_offset + r] (+)= sum_k W[r, k] * x[c, k] for the
// rows of one part. Owns bindings, push constants, the row and column assignment and the
// reduction, so a kernel writes only its inner loop. NUM_ROWS rows per workgroup; the threads
// stride over K and each keeps one fp32 partial sum per row and column, summed by subgroupAdd and
// then across subgroups in shared memory. Workgroups beyond maxComputeWorkGroupCount[0] continue
// in the y dimension of the dispatch; column groups are the z dimension.
// With GLU defined, two weights of one type and shape, gate (binding 0) and up (binding 1), take
// the same x: each load of x serves both, every thread keeps a partial sum per weight, and
// y = silu(gate x) * (up x), the SwiGLU of a feed-forward block, in one dispatch (with GLU_GELU
// gelu(gate x) * (up x), the GeGLU of Gemma).
// Quantized weights are read through mul_mat_vec_items.glsl (wide loads, several items in
// flight, per-type inner loops) where that measured faster on an H200; Q6_K and Q8_0, and the
// fused gate+up kernel of every type but MXFP4, read 16-value slices through dequant.glsl (as
// float weights do): there the item loops measured slower.
// With EXPERTS (a mixture-of-experts FFN) the weights are the 3-D expert tensor of one part
// (experts expert_first .. + expert_count, `rows` rows each) and column z of the dispatch is the
// slot (token t, j-th chosen expert): it multiplies the rows of expert ids[z] (moe_route.comp's
// choice, read here: no host round trip) with x column z (x_per_slot) or t, into y row z; a slot
// whose expert lies in another part does nothing. With EXPERT_TILES (prefill) column z is instead
// tile z of moe_group.comp (up to NUM_COLS slots of one expert): each load of the expert's
// weights serves all of them, slot s reading x column s (x_per_slot) or its token's and writing
// y row s. EXPERT_BIAS adds that expert's bias row (the
// gate's and the up's under GLU); GLU_OAI is gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai).
// Bindings: the weights (one or two), x, y; with EXPERTS the ids, then the biases.
#include "types.glsl"
#if QUANT_K > 1 && !defined(DATA_A_Q6_K) && !defined(DATA_A_Q8_0) && (!defined(GLU) || defined(DATA_A_MXFP4))
#define MAT_VEC_ITEMS
#endif

float dot16(mat4 a, mat4 b) {
    return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}

#if defined(MAT_VEC_ITEMS)
#include "mul_mat_vec_items.glsl"
#else
#include "dequant.glsl"
#endif
#if defined(GLU)
#if defined(MAT_VEC_ITEMS)
#define ITEMS_UP
#include "mul_mat_vec_items.glsl"
#else
#define DEQUANT_UP
#include "dequant.glsl"
#endif
const uint NUM_MATS = 2;
// Weight m's values from function f (its *_up twin reads the up weights).
#define WEIGHTS(m, f, args) ((m) == 0 ? f args : f##_up args)
#if defined(GLU_GELU)
#include "gelu.glsl"
float glu_act(float v) { return gelu(v); }
#elif defined(GLU_OAI)
const float OAI_ALPHA = 1.702, OAI_LIMIT = 7.0;
float glu_oai(float g, float u) {
    g = min(g, OAI_LIMIT);
    return g / (1.0 + exp(-OAI_ALPHA * g)) * (clamp(u, -OAI_LIMIT, OAI_LIMIT) + 1.0);
}
#else
float glu_act(float v) { return v / (1.0 + exp(-v)); }
#endif
#else
const uint NUM_MATS = 1;
#define WEIGHTS(m, f, args) f args
#endif

layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(constant_id = 1) const uint NUM_ROWS = 2;
layout(constant_id = 2) const uint NUM_COLS = 1;
#if defined(MAT_VEC_ITEMS)
// Items each thread loads per row and weight before any math: as many as keep the loaded words
// of all rows and weights within RAW_WORDS registers (up to 4), so that more rows per workgroup
// or a second weight trade items in flight for rows instead of spilling registers.
const uint RAW_WORDS = 64;
const uint ITEMS_FIT = RAW_WORDS / (NUM_MATS * NUM_ROWS * ITEM_RAW_WORDS);
const uint UNROLL = ITEMS_FIT < 1 ? 1 : (ITEMS_FIT > 4 ? 4 : ITEMS_FIT);
#endif

layout(std430, binding = NUM_MATS) readonly buffer X { float x[]; };
layout(std430, binding = NUM_MATS) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = NUM_MATS + 1) buffer Y { float y[]; };
#if defined(EXPERT_TILES)
// moe_group.comp's output: the slots by expert, then (expert, first, count) per tile
layout(std430, binding = NUM_MATS + 2) readonly buffer Tiles { uint tiles[]; };
#elif defined(EXPERTS)
layout(std430, binding = NUM_MATS + 2) readonly buffer Ids { uint expert_ids[]; };
#endif
#if defined(EXPERT_BIAS)
layout(std430, binding = NUM_MATS + 3) readonly buffer Bias { float bias[]; };   // [n_expert, rows]
#if defined(GLU)
layout(std430, binding = NUM_MATS + 4) readonly buffer BiasUp { float bias_up[]; };
#endif
#endif

// The same block as mul_mat.comp's: matmul.py packs both alike.
layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint n;           // columns of x and y (tokens)
    uint y_offset;    // index in a column of y of this part's first row
    uint y_stride;    // length of a column of y: all rows of the tensor
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite; GLU: always overwrites
#if defined(EXPERTS)
    uint n_used;        // experts per token: slot z is token z / n_used
    uint expert_first;  // the part's first expert
    uint expert_count;  // experts in the part
    uint x_per_slot;    // 1: x has a column per slot (the down product), 0: one per token
#endif
} p;

shared float partial[NUM_COLS * NUM_MATS * NUM_ROWS][BLOCK_SIZE];

#if defined(EXPERT_TILES)
uint tile_word(uint i) { return tiles[p.n + 3 * gl_WorkGroupID.z + i]; }
uint slot_expert() { return tile_word(0); }
uint stored_cols(uint col0) { return tile_word(2); }
// The slot of the tile's column `col` (past its count: its last slot, computed, never stored).
uint column_slot(uint col) { return tiles[tile_word(1) + min(col, tile_word(2) - 1)]; }
uint first_col() { return 0; }
#elif defined(EXPERTS)
// NUM_COLS is 1: workgroup z is one slot.
uint slot_expert() { return expert_ids[gl_WorkGroupID.z]; }
uint stored_cols(uint col0) { return 1; }
uint column_slot(uint col) { return col; }
uint first_col() { return gl_WorkGroupID.z; }
#endif

#if defined(EXPERTS)
// p.rows (nothing to do) for an empty tile or when the expert is in another part.
uint first_row() {
    const uint row = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
    return stored_cols(0) != 0 && slot_expert() - p.expert_first < p.expert_count ? row : p.rows;
}

// Row `row` of the expert within the part; rows past the end clamped as below.
uint clamped_row(uint row) { return (slot_expert() - p.expert_first) * p.rows + min(row, p.rows - 1); }

// The column of x that column `col` reads.
uint clamped_col(uint col) { return p.x_per_slot != 0 ? column_slot(col) : column_slot(col) / p.n_used; }

// The row of y that column `col` writes.
uint out_col(uint col) { return column_slot(col); }
#else
uint first_row() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NUM_ROWS;
}

// Rows past the end are computed on a clamped row (no branch in the loop) and never stored.
uint clamped_row(uint row) { return min(row, p.rows - 1); }

uint first_col() {
    return gl_WorkGroupID.z * NUM_COLS;
}

// Columns past the end are computed on a clamped column and never stored.
uint clamped_col(uint col) { return min(col, p.n - 1); }
uint stored_cols(uint col0) { return min(NUM_COLS, p.n - col0); }
uint out_col(uint col) { return col; }
#endif

// The output of row r from its products (gate's and up's under GLU).
float epilogue(uint r, float a, float b) {
#if defined(EXPERT_BIAS)
    const uint bias_row = slot_expert() * p.rows + r;
    a += bias[bias_row];
#if defined(GLU)
    b += bias_up[bias_row];
#endif
#endif
#if defined(GLU_OAI)
    return glu_oai(a, b);
#elif defined(GLU)
    return glu_act(a) * b;
#else
    return a;
#endif
}

// x[k .. k+15], k a multiple of 16 (column c starts at c * ncols).
mat4 load_x16(uint k) {
    return mat4(x4[k / 4], x4[k / 4 + 1], x4[k / 4 + 2], x4[k / 4 + 3]);
}

// acc[c][m][r]: column col0 + c, weight m, row row0 + r.
void reduce_and_store(uint row0, uint col0, inout float acc[NUM_COLS][NUM_MATS][NUM_ROWS]) {
    for (uint c = 0; c < NUM_COLS; c++) {
        for (uint m = 0; m < NUM_MATS; m++) {
            for (uint r = 0; r < NUM_ROWS; r++) {
                acc[c][m][r] = subgroupAdd(acc[c][m][r]);
            }
        }
    }
    if (gl_NumSubgroups > 1) {
        if (subgroupElect()) {
            for (uint c = 0; c < NUM_COLS; c++) {
                for (uint m = 0; m < NUM_MATS; m++) {
                    for (uint r = 0; r < NUM_ROWS; r++) {
                        partial[(c * NUM_MATS + m) * NUM_ROWS + r][gl_SubgroupID] = acc[c][m][r];
                    }
                }
            }
        }
        barrier();
        for (uint c = 0; c < NUM_COLS; c++) {
            for (uint m = 0; m < NUM_MATS; m++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    acc[c][m][r] = 0.0;
                    for (uint i = 0; i < gl_NumSubgroups; i++) {
                        acc[c][m][r] += partial[(c * NUM_MATS + m) * NUM_ROWS + r][i];
                    }
                }
            }
        }
    }
    if (gl_LocalInvocationID.x == 0) {
        for (uint c = 0; c < stored_cols(col0); c++) {
            for (uint r = 0; r < NUM_ROWS && row0 + r < p.rows; r++) {
                const uint i = out_col(col0 + c) * p.y_stride + p.y_offset + row0 + r;
                const float v = epilogue(row0 + r, acc[c][0][r], acc[c][NUM_MATS - 1][r]);
                y[i] = p.accumulate != 0 ? y[i] + v : v;
            }
        }
    }
}

// Matrix x vector (decode), for up to NUM_COLS vectors at once (a few tokens or sequences: the
// weights are read once for all of them): y[c, y_offset + r] (+)= sum_k W[r, k] * x[c, k] for the
// rows of one part. Owns bindings, push constants, the row and column assignment and the
// reduction, so a kernel writes only its inner loop. NUM_ROWS rows per group of LANES lanes (the
// workgroup, or each subgroup or part of one: ROW_LANES); a group's lanes stride over K and each
// keeps one fp32 partial sum per row and column, summed by subgroupAdd and then across subgroups
// in shared memory (by shuffles within the subgroup where the groups are smaller). Workgroups
// beyond maxComputeWorkGroupCount[0] continue in the y dimension of the dispatch; column groups
// are the z dimension.
// With GLU defined, two weights of one type and shape, gate (binding 0) and up (binding 1), take
// the same x: each load of x serves both, every thread keeps a partial sum per weight, and
// y = silu(gate x) * (up x), the SwiGLU of a feed-forward block, in one dispatch (with GLU_GELU
// gelu(gate x) * (up x), the GeGLU of Gemma).
// Quantized weights are read through mul_mat_vec_items.glsl (wide loads, several items in
// flight, per-type inner loops) where that measured faster on an H200; Q6_K and Q8_0, and the
// fused gate+up kernel of every type but MXFP4, read 16-value slices through dequant.glsl (as
// float weights do): there the item loops measured slower. Over 8-bit x (X8), the K-quants take
// the items (their quants from group_quants) but with X8_SLICES (the variants for several
// columns), the other types dequant.glsl's quants16.
// With EXPERTS (a mixture-of-experts FFN) the weights are the 3-D expert tensor of one part
// (experts expert_first .. + expert_count, `rows` rows each) and column z of the dispatch is the
// slot (token t, j-th chosen expert): it multiplies the rows of expert ids[z] (moe_route.comp's
// choice, read here: no host round trip) with x column z (x_per_slot) or t, into y row z; a slot
// whose expert lies in another part does nothing. With EXPERT_TILES (prefill) column z is instead
// tile z of moe_group.comp (up to NUM_COLS slots of one expert): each load of the expert's
// weights serves all of them, slot s reading x column s (x_per_slot) or its token's and writing
// y row s. EXPERT_BIAS adds that expert's bias row (the
// gate's and the up's under GLU); GLU_OAI is gpt-oss's clamped SwiGLU (llama.cpp's swiglu_oai).
// With NORM defined, x is the raw input of an RMSNorm that the kernel applies itself: each load
// of x is multiplied by the norm weight and its squares are summed (every workgroup loads all of
// x), and the products are scaled by 1 / rms(x) before the store; the norm's own dispatch and its
// barrier are gone. With X8_RMS defined (8-bit x only), x's blocks are an RMSNorm's input not yet
// scaled (x8.glsl's s; a residual product's RMS_BLOCKS, mul_mat_vec.comp): the loops sum the
// blocks' s as NORM sums squares, and the products are scaled alike. With QKV defined, the
// weight is Q, K and V (or Q and K) one after the other in rows, and rows from k_first and from
// v_first go to the second and third output: one dispatch for the three projections.
// Bindings: the weights (one or two), x, y (QKV: y_q, y_k, y_v), then with EXPERTS the ids and
// the biases, with NORM the norm weight.
// With COLS defined (mul_mat_cols.comp, several columns: batched decode) NUM_COLS is that
// compile-time count and NUM_ROWS the rows of each subgroup; the kernel has its own loops and
// reduction (neither the item loops nor reduce_and_store below), and workgroups are numbered
// column group fastest: the column groups of one row block run side by side, so that the
// weights they share come from memory once and from the L2 cache for the others.
#include "types.glsl"
#if QUANT_K > 1 && !defined(DATA_A_Q6_K) && !defined(DATA_A_Q8_0) && (!defined(GLU) || defined(DATA_A_MXFP4)) && !defined(COLS) && !defined(X8)
#define MAT_VEC_ITEMS
#endif
// Over 8-bit x, the types whose items give their quants (group_quants) take the item loops too.
#if defined(X8) && !defined(X8_SLICES) && QUANT_K == 256   // the K-quants
#define X8_ITEMS
#endif
#if defined(MAT_VEC_ITEMS) || defined(X8_ITEMS)
#define ITEM_LOOPS
#endif
#if defined(NORM) || defined(X8_RMS)
#define ROW_NORM   // a sum of x^2 per column beside the products, which 1 / rms scales
#endif

#if defined(ITEM_LOOPS)
#include "mul_mat_vec_items.glsl"
#else
#include "dequant.glsl"
#endif
#if defined(GLU)
#if defined(ITEM_LOOPS)
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
#include "glu_oai.glsl"
#else
float glu_act(float v) { return v / (1.0 + exp(-v)); }
#endif
#else
const uint NUM_MATS = 1;
#define WEIGHTS(m, f, args) f args
#endif

layout(constant_id = 0) const uint BLOCK_SIZE = 32;
layout(constant_id = 1) const uint NUM_ROWS = 2;
#if defined(COLS)
const uint NUM_COLS = COLS;
#else
layout(constant_id = 2) const uint NUM_COLS = 1;
// The lanes that share a row's K (constant 4, as mul_mat_cols.comp's ROW_LANES): 0, the whole
// workgroup, whose subgroups' sums meet in shared memory; or a divisor of the subgroup size, each
// group of that many lanes taking NUM_ROWS rows of its own, summed by shuffles alone, so that a
// workgroup covers WORKGROUP_ROWS rows (a 32-row block: BLOCKS_OUT needs no counter).
layout(constant_id = 4) const uint ROW_LANES = 0;
const uint LANES = ROW_LANES == 0 ? BLOCK_SIZE : ROW_LANES;
const uint WORKGROUP_ROWS = NUM_ROWS * (BLOCK_SIZE / LANES);
#endif
#if defined(ITEM_LOOPS)
// Items each thread loads per row and weight before any math: as many as keep the loaded words
// of all rows and weights within RAW_WORDS registers (up to 4), so that more rows per workgroup
// or a second weight trade items in flight for rows instead of spilling registers.
const uint RAW_WORDS = 64;
const uint ITEMS_FIT = RAW_WORDS / (NUM_MATS * NUM_ROWS * ITEM_RAW_WORDS);
const uint UNROLL = ITEMS_FIT < 1 ? 1 : (ITEMS_FIT > 4 ? 4 : ITEMS_FIT);
#endif

#if defined(ITEM_LOOPS)
// The steps the item loops share (mul_mat_vec.comp's f32 and 8-bit ones, mul_mat_cols.comp's
// 8-bit one): the first byte of each row (rows first, first + step, ...); the loads of `count` items
// (from i0, `stride` apart, clamped to the last) of every row and weight before any math; the
// words of item u in place.
#define ITEM_ROW_BYTES(row_byte, first, step) \
    uint row_byte[NUM_ROWS]; \
    [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
        row_byte[r_] = clamped_row((first) + r_ * (step)) * (p.ncols / QUANT_K) * BLOCK_BYTES; \
    }
#define LOAD_ITEMS(raw, count, i0, stride, items, row_byte) \
    item_raw raw[count][NUM_MATS][NUM_ROWS]; \
    [[unroll]] for (uint u_ = 0; u_ < (count); u_++) { \
        const uint item_ = min((i0) + u_ * (stride), (items) - 1); \
        [[unroll]] for (uint m_ = 0; m_ < NUM_MATS; m_++) { \
            [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
                raw[u_][m_][r_] = WEIGHTS(m_, load_item, (row_byte[r_], item_)); \
            } \
        } \
    }
#define ALIGN_ITEMS(w, raw, u, item) \
    item_words w[NUM_MATS][NUM_ROWS]; \
    [[unroll]] for (uint m_ = 0; m_ < NUM_MATS; m_++) { \
        [[unroll]] for (uint r_ = 0; r_ < NUM_ROWS; r_++) { \
            w[m_][r_] = align_item(raw[u][m_][r_], item); \
        } \
    }
#endif

#if defined(QKV)
const uint NUM_OUTS = 3;
#else
const uint NUM_OUTS = 1;
#endif
layout(std430, binding = NUM_MATS) readonly buffer X { float x[]; };
layout(std430, binding = NUM_MATS) readonly buffer X4 { vec4 x4[]; };
#if defined(X8)
#include "x8.glsl"
layout(std430, binding = NUM_MATS) readonly buffer Activations8 { ivec4 x8[]; };
#endif
#if defined(BLOCKS_OUT)   // last workgroups read back what others stored (mul_mat_vec.comp)
#define Y_ACCESS coherent
#else
#define Y_ACCESS
#endif
layout(std430, binding = NUM_MATS + 1) Y_ACCESS buffer Y { float y[]; };
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
#if defined(QKV)
layout(std430, binding = NUM_MATS + 2) writeonly buffer Y_K { float y_k[]; };
layout(std430, binding = NUM_MATS + 3) writeonly buffer Y_V { float y_v[]; };
#endif
#if defined(NORM)
layout(std430, binding = NUM_MATS + 1 + NUM_OUTS) readonly buffer N { float norm_w[]; };
layout(std430, binding = NUM_MATS + 1 + NUM_OUTS) readonly buffer N4 { vec4 norm_w4[]; };
#endif

#include "mul_mat_push.glsl"

#if defined(ROW_NORM)
const uint NUM_SUMS = 1;   // sum of x^2 per column, reduced beside the products
float sumsq[NUM_COLS];
#else
const uint NUM_SUMS = 0;
#endif
#if !defined(COLS)
shared float partial[NUM_COLS * (NUM_MATS * NUM_ROWS + NUM_SUMS)][BLOCK_SIZE];
#endif

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
uint workgroup_row() {
    const uint row = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * WORKGROUP_ROWS;
    return stored_cols(0) != 0 && slot_expert() - p.expert_first < p.expert_count ? row : p.rows;
}

// Row `row` of the expert within the part; rows past the end clamped as below.
uint clamped_row(uint row) { return (slot_expert() - p.expert_first) * p.rows + min(row, p.rows - 1); }

// The column of x that column `col` reads.
uint clamped_col(uint col) { return p.x_per_slot != 0 ? column_slot(col) : column_slot(col) / p.n_used; }

// The row of y that column `col` writes.
uint out_col(uint col) { return column_slot(col); }
#else
#if defined(COLS)
// mul_mat_cols.comp's layout: ROW_LANES lanes share each row (split its K), each group of them
// over NUM_ROWS rows: a subgroup covers NUM_ROWS x (subgroup size / ROW_LANES) rows.
layout(constant_id = 4) const uint ROW_LANES = 32;
uint column_groups() { return (p.n + NUM_COLS - 1) / NUM_COLS; }
uint workgroup_index() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

// The workgroup's first row.
uint first_row() {
    return workgroup_index() / column_groups() * NUM_ROWS * gl_NumSubgroups * (gl_SubgroupSize / ROW_LANES);
}
#else
// The workgroup's first row.
uint workgroup_row() {
    return (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * WORKGROUP_ROWS;
}
#endif

// Rows past the end are computed on a clamped row (no branch in the loop) and never stored.
uint clamped_row(uint row) { return min(row, p.rows - 1); }

#if defined(COLS)
uint first_col() { return workgroup_index() % column_groups() * NUM_COLS; }
#else
uint first_col() {
    return gl_WorkGroupID.z * NUM_COLS;
}
#endif

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

// Column c (< NUM_COLS) of this workgroup's columns of x: the 16 values from k (a multiple of
// 16), the 4 values of 4-vector i, or the value k. Each value of a column must be loaded exactly
// once per invocation: with NORM the loads gather the sum of squares.
mat4 load_xc16(uint c, uint k) {
    const uint i = (clamped_col(first_col() + c) * p.ncols + k) / 4;
    const mat4 v = mat4(x4[i], x4[i + 1], x4[i + 2], x4[i + 3]);
#if defined(NORM)
    sumsq[c] += dot16(v, v);
    return matrixCompMult(v, mat4(norm_w4[k / 4], norm_w4[k / 4 + 1], norm_w4[k / 4 + 2], norm_w4[k / 4 + 3]));
#else
    return v;
#endif
}

vec4 load_xc4(uint c, uint i) {
    const vec4 v = x4[clamped_col(first_col() + c) * (p.ncols / 4) + i];
#if defined(NORM)
    sumsq[c] += dot(v, v);
    return v * norm_w4[i];
#else
    return v;
#endif
}

float load_xc1(uint c, uint k) {
    const float v = x[clamped_col(first_col() + c) * p.ncols + k];
#if defined(NORM)
    sumsq[c] += v * v;
    return v * norm_w[k];
#else
    return v;
#endif
}

void clear_sums() {
#if defined(ROW_NORM)
    for (uint c = 0; c < NUM_COLS; c++) {
        sumsq[c] = 0.0;
    }
#endif
}

#if defined(QKV)
#include "qkv_store.glsl"
#endif
#if defined(BLOCKS_OUT)
// The rows this workgroup stored, as stored: a workgroup of whole 32-row blocks quantizes them
// from here (mul_mat_vec.comp), with no fence on its stores to y.
shared float stored_sh[WORKGROUP_ROWS];
#endif

// Row `row` of this part of column col of y: QKV picks the output by the row's place in the
// weight; otherwise y (+)= v (SPLIT_K: y += v atomically, qkv_store.glsl likewise).
void store(uint col, uint row, float v) {
#if defined(QKV)
    store_qkv(col, p.y_offset + row, v);
#else
    const uint i = col * p.y_stride + p.y_offset + row;
#if defined(SPLIT_K)   // workgroups of other ranges of K add to the same y (mul_mat_cols.comp)
    atomicAdd(y[i], v);
#else
    const float stored = p.accumulate != 0 ? y[i] + v : v;
    y[i] = stored;
#endif
#if defined(BLOCKS_OUT)
    stored_sh[row - workgroup_row()] = stored;
#endif
#endif
}

#if !defined(COLS)
// This invocation's place in its lane group (0 .. LANES - 1) and the group's first row.
uint row_lane() { return gl_LocalInvocationID.x % LANES; }
uint first_row() { return workgroup_row() + gl_LocalInvocationID.x / LANES * NUM_ROWS; }

// acc[c][m][r]: column col0 + c, weight m, row row0 + r (of this invocation's lane group).
void reduce_and_store(uint row0, uint col0, inout float acc[NUM_COLS][NUM_MATS][NUM_ROWS]) {
    if (LANES < BLOCK_SIZE) {   // within the subgroup: the group's sums, in each of its lanes
        for (uint d = 1; d < LANES; d *= 2) {
            for (uint c = 0; c < NUM_COLS; c++) {
                for (uint m = 0; m < NUM_MATS; m++) {
                    for (uint r = 0; r < NUM_ROWS; r++) {
                        acc[c][m][r] += subgroupShuffleXor(acc[c][m][r], d);
                    }
                }
#if defined(ROW_NORM)
                sumsq[c] += subgroupShuffleXor(sumsq[c], d);
#endif
            }
        }
    } else {
        for (uint c = 0; c < NUM_COLS; c++) {
            for (uint m = 0; m < NUM_MATS; m++) {
                for (uint r = 0; r < NUM_ROWS; r++) {
                    acc[c][m][r] = subgroupAdd(acc[c][m][r]);
                }
            }
        }
#if defined(ROW_NORM)
        for (uint c = 0; c < NUM_COLS; c++) {
            sumsq[c] = subgroupAdd(sumsq[c]);
        }
#endif
    }
    if (LANES == BLOCK_SIZE && gl_NumSubgroups > 1) {
        if (subgroupElect()) {
            for (uint c = 0; c < NUM_COLS; c++) {
                for (uint m = 0; m < NUM_MATS; m++) {
                    for (uint r = 0; r < NUM_ROWS; r++) {
                        partial[(c * NUM_MATS + m) * NUM_ROWS + r][gl_SubgroupID] = acc[c][m][r];
                    }
                }
#if defined(ROW_NORM)
                partial[NUM_COLS * NUM_MATS * NUM_ROWS + c][gl_SubgroupID] = sumsq[c];
#endif
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
#if defined(ROW_NORM)
            sumsq[c] = 0.0;
            for (uint i = 0; i < gl_NumSubgroups; i++) {
                sumsq[c] += partial[NUM_COLS * NUM_MATS * NUM_ROWS + c][i];
            }
#endif
        }
    }
    if (row_lane() == 0) {
        for (uint c = 0; c < stored_cols(col0); c++) {
#if defined(ROW_NORM)
            const float scale = inversesqrt(sumsq[c] / float(p.ncols) + p.eps);
#else
            const float scale = 1.0;
#endif
            for (uint r = 0; r < NUM_ROWS && row0 + r < p.rows; r++) {
                store(out_col(col0 + c), row0 + r, epilogue(row0 + r, scale * acc[c][0][r], scale * acc[c][NUM_MATS - 1][r]));
            }
        }
    }
}
#endif

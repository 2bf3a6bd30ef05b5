// The push constants of every product kernel: mat-vec and mat-cols (mul_mat_vec_base.glsl) and
// the mat-mat kernels (mul_mat_base.glsl); matmul.py's _push packs them.
layout(push_constant) uniform Push {
    uint ncols;       // K
    uint rows;        // rows of this part
    uint n;           // columns of x and y (tokens; with experts, the slots)
    uint y_offset;    // index in a column of y of this part's first row
    uint y_stride;    // length of a column of y: all rows of the tensor
    uint accumulate;  // 1: add to what y holds (residual), 0: overwrite; GLU: always overwrites
#if defined(EXPERTS) || defined(EXPERT_TILES)
    uint n_used;        // experts per token: slot s is token s / n_used
    uint expert_first;  // the part's first expert
    uint expert_count;  // experts in the part
    uint x_per_slot;    // 1: x has a column per slot (the down product), 0: one per token
#endif
#if defined(ROW_NORM)
    float eps;        // the RMSNorm's
#endif
#if defined(QKV)
    uint k_first;     // first row of K in the weight
    uint v_first;     // first row of V (the rows when there is no V)
#endif
} p;

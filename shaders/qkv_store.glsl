// What the kernels that take Q, K and V (or Q and K) as one weight share (QKV defined): row r of
// the weight (y_offset included) in column col goes to its section's output, y (Q), y_k or
// y_v, each [n, its rows]; with SPLIT_K added to it atomically (the outputs zeroed before).
// Included where y, y_k, y_v and the push block `p` (y_stride, k_first, v_first) are declared.
#if defined(SPLIT_K)
#define QKV_STORE(out, i, v) atomicAdd(out[i], v)
#else
#define QKV_STORE(out, i, v) out[i] = v
#endif
void store_qkv(uint col, uint r, float v) {
    if (r < p.k_first) {
        QKV_STORE(y, col * p.k_first + r, v);
    } else if (r < p.v_first) {
        QKV_STORE(y_k, col * (p.v_first - p.k_first) + r - p.k_first, v);
    } else {
        QKV_STORE(y_v, col * (p.y_stride - p.v_first) + r - p.v_first, v);
    }
}

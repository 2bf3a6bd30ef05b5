// Activations quantized to 8 bits per block of 32 values (quantize_x8.comp and rms_norm.comp's X8
// write them, mul_mmq.comp and the 8-bit mat-vec kernels read them), like ggml's q8_1 but with a
// sum per 16-value half: x[j] ~ d * q[j], and ds = (d, d * sum of q[0..15], d * sum of q[16..31],
// s). The sums serve the weights' offsets: a weight slice of 16 values a * w + b dotted with d * q
// is a * d * (w . q) + b * d * sum(q). s is 0, except in the blocks a residual product writes for
// the next RMSNorm's products (mul_mat_vec.comp's RMS_BLOCKS): those hold x * norm weight not yet
// scaled by 1 / rms(x), and s = the sum of x^2 over the block, from which the products that read
// them (X8_RMS) take the scale.
// Stored as 16-byte words in three planes per column of x (nb blocks each): word x8_word(c, nb, b,
// h) for h = 0, 1 holds values 16h .. 16h+15 of block b as signed bytes (byte i of component j
// value 4j + i), h = 2 its ds as floats. Adjacent threads reading the same word of adjacent blocks
// read adjacent memory: each load of a subgroup is one contiguous span (an array of 48-byte
// blocks took three times the cache traffic).
#if !defined(X8_GLSL)
#define X8_GLSL
uint x8_word(uint col, uint nb, uint b, uint h) { return (3 * col + h) * nb + b; }
#endif

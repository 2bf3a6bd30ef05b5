// Activations quantized to 8 bits per block of 32 values (quantize_x8.comp writes them,
// mul_mmq.comp reads them), like ggml's q8_1 but with a sum per 16-value half: x[j] ~ d * q[j],
// and ds = (d, d * sum of q[0..15], d * sum of q[16..31], 0). The sums serve the weights'
// offsets: a weight slice of 16 values a * w + b dotted with d * q is a * d * (w . q) + b * d * sum(q).
// qs[h] holds values 16h .. 16h+15 as signed bytes, byte i of component c value 4c + i.
#if !defined(X8_GLSL)
#define X8_GLSL
struct block_x8 { ivec4 qs[2]; vec4 ds; };
#endif

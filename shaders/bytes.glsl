// Four bytes of a little-endian word, each as a float (dequant.glsl's slices, the
// cooperative-matrix kernel's items). A byte placed in the mantissa of 2^23 and 2^23 subtracted
// gives its value exactly with integer ops and one add, where a conversion instruction per
// value (quarter rate on NVIDIA) bounds the throughput of quantized kernels.
#if !defined(BYTES_GLSL)
#define BYTES_GLSL
vec4 magic_bytes4(uint w) { return uintBitsToFloat((uvec4(w, w >> 8, w >> 16, w >> 24) & 255u) | 0x4B000000u); }
vec4 bytes4(uint w) { return magic_bytes4(w) - 8388608.0; }
// bytes4(w) - offset in the same single add (offset a constant).
vec4 bytes4_minus(uint w, float offset) { return magic_bytes4(w) - (8388608.0 + offset); }
// Signed bytes: flipping the sign bit gives byte + 128.
vec4 sbytes4(uint w) { return magic_bytes4(w ^ 0x80808080u) - 8388736.0; }
#endif

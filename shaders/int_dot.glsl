// Packed signed 8-bit dot products (SPV_KHR_integer_dot_product), declared through
// GL_EXT_spirv_intrinsics: the compilers here lack GL_EXT_integer_dot_product, whose
// dotPacked4x8EXT this is. Opcode 4450 is OpSDot; capabilities 6019 and 6018 are DotProduct and
// DotProductInput4x8BitPacked; the literal 0 is PackedVectorFormat4x8Bit. OpSDot plus an add,
// not OpSDotAccSat: the saturating form has no single instruction on NVIDIA's GPUs.
// Included before anything else that is not a directive (it enables an extension).
#extension GL_EXT_spirv_intrinsics : require

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot4x8(int a, int b, spirv_literal int packed_format);

// acc + the dot product of the 16 signed bytes of a and of b (at most 16 * 128 * 128 in size).
int idot16(ivec4 a, ivec4 b, int acc) {
    return acc + dot4x8(a.x, b.x, 0) + dot4x8(a.y, b.y, 0) + dot4x8(a.z, b.z, 0) + dot4x8(a.w, b.w, 0);
}

// float(v) for |v| < 2^22 (an idot16 of zero acc) in two full-rate instructions: v added to the
// bits of 1.5 * 2^23 puts it in the mantissa; int-to-float conversion runs at a quarter rate on
// NVIDIA's GPUs.
float small_int_float(int v) {
    return intBitsToFloat(0x4B400000 + v) - 12582912.0;
}

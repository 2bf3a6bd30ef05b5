// Packed signed 8-bit dot products (SPV_KHR_integer_dot_product), declared through
// GL_EXT_spirv_intrinsics: the compilers here lack GL_EXT_integer_dot_product, whose
// dotPacked4x8AccSatEXT this is. Opcode 4453 is OpSDotAccSat; capabilities 6019 and 6018 are
// DotProduct and DotProductInput4x8BitPacked; the literal 0 is PackedVectorFormat4x8Bit.
// Included before anything else that is not a directive (it enables an extension).
#extension GL_EXT_spirv_intrinsics : require

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4453)
int dot4x8_acc(int a, int b, int acc, spirv_literal int packed_format);

// acc + the dot product of the 16 signed bytes of a and of b (at most 16 * 128 * 128: no saturation).
int idot16(ivec4 a, ivec4 b, int acc) {
    acc = dot4x8_acc(a.x, b.x, acc, 0);
    acc = dot4x8_acc(a.y, b.y, acc, 0);
    acc = dot4x8_acc(a.z, b.z, acc, 0);
    return dot4x8_acc(a.w, b.w, acc, 0);
}

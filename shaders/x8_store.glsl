// Stores 4-vector i4 of an f32 output of rows of `cols` values (a multiple of 32) as x8.glsl's
// 8-bit blocks, as quantize_x8.comp makes them: the 8 invocations holding a block's 4-vectors
// (consecutive lanes of one subgroup, all of them calling) find its max and its halves' sums by
// shuffles; each writes its packed quants, the first of each half its sum, the first the ds word's
// last float `sq` (x8.glsl: what the lanes pass; 0 but for an RMSNorm's deferred input). The includer declares
// the uint buffer q8 and enables GL_KHR_shader_subgroup_shuffle, and includes x8.glsl.
void store_x8(uint i4, vec4 v, uint cols, float sq) {
    const uint n4 = cols / 4, nb = cols / 32, col = i4 / n4, b = i4 % n4 / 8, lane = i4 % 8;
    const vec4 a = abs(v);
    float amax = max(max(a.x, a.y), max(a.z, a.w));
    amax = max(amax, subgroupShuffleXor(amax, 1));
    amax = max(amax, subgroupShuffleXor(amax, 2));
    amax = max(amax, subgroupShuffleXor(amax, 4));
    const float d = amax / 127.0, id = amax > 0.0 ? 1.0 / d : 0.0;
    const ivec4 qi = ivec4(roundEven(v * id));
    int sum = qi.x + qi.y + qi.z + qi.w;
    sum += subgroupShuffleXor(sum, 1);
    sum += subgroupShuffleXor(sum, 2);
    const uint ds = 4 * x8_word(col, nb, b, 2);
    q8[4 * x8_word(col, nb, b, lane / 4) + lane % 4] = pack32(i8vec4(qi));
    if (lane % 4 == 0) {
        q8[ds + 1 + lane / 4] = floatBitsToUint(d * float(sum));
    }
    if (lane == 0) {
        q8[ds] = floatBitsToUint(d);
        q8[ds + 3] = floatBitsToUint(sq);
    }
}

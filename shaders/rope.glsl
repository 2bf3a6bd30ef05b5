// Rotary position embedding for one pair, llama.cpp semantics: the normal layout rotates
// (2i, 2i+1) of a head, NeoX (i, i + rope_dim/2); theta = pos * base^(-2i/rope_dim), divided by
// freq_factors[i] with FREQ_FACTORS (Llama 3 long-context scaling). With FREQ_FACTORS the
// includer declares freq_factors[] first.
layout(constant_id = 1) const bool NEOX = false;

// Offsets inside a head of the two elements of pair i.
uvec2 rope_pair(uint i, uint half_dim) {
    return NEOX ? uvec2(i, i + half_dim) : uvec2(2 * i, 2 * i + 1);
}

// The pair (x0, x1) at position pos rotated by pair i's angle.
vec2 rope_rotate(float x0, float x1, uint pos, uint i, uint rope_dim, float log2_base) {
    float theta = float(pos) * exp2(-2.0 * float(i) / float(rope_dim) * log2_base);
#if defined(FREQ_FACTORS)
    theta /= freq_factors[i];
#endif
    const float c = cos(theta), s = sin(theta);
    return vec2(x0 * c - x1 * s, x0 * s + x1 * c);
}

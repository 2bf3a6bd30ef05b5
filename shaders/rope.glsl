// Rotary position embedding for one pair, llama.cpp semantics: the normal layout rotates
// (2i, 2i+1) of a head, NeoX (i, i + rope_dim/2); theta = pos * base^(-2i/rope_dim), divided by
// freq_factors[i] with FREQ_FACTORS (Llama 3 long-context scaling). The includer defines
// NEOX_CONSTANT_ID (the specialization constant that says NeoX) and, with FREQ_FACTORS, declares
// freq_factors[] first.
layout(constant_id = NEOX_CONSTANT_ID) const bool NEOX = false;

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

// The other element of value d's pair (d < rope_dim).
uint rope_partner(uint d, uint half_dim) {
    return NEOX ? (d < half_dim ? d + half_dim : d - half_dim) : d ^ 1u;
}

// Value d of a head (d < rope_dim) rotated at pos, from its own value x and its partner's.
float rope_value(float x, float partner, uint d, uint pos, uint rope_dim, float log2_base) {
    const uint half_dim = rope_dim / 2;
    const bool first = NEOX ? d < half_dim : (d & 1u) == 0u;
    const vec2 r = rope_rotate(first ? x : partner, first ? partner : x, pos, NEOX ? d % half_dim : d / 2, rope_dim,
                               log2_base);
    return first ? r.x : r.y;
}

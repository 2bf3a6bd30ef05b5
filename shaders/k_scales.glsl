// The 6-bit scales and mins of Q4_K and Q5_K blocks, as the 16-byte kernels' loads hold them.
#if !defined(K_SCALES_GLSL)
#define K_SCALES_GLSL

// Scale and min of sub-block j (ggml's get_scale_min_k4) from the block's three scale words
// (its bytes 4 .. 15).
vec2 scale_min_k4(uvec3 s, uint j) {
    const uint sh = 8 * (j & 3u);
    const uint b0 = s.x >> sh, b1 = s.y >> sh, b2 = s.z >> sh;
    return j < 4 ? vec2(b0 & 63u, b1 & 63u)
                 : vec2((b2 & 15u) | ((b0 >> 2) & 48u), ((b2 >> 4) & 15u) | ((b1 >> 2) & 48u));
}

#endif

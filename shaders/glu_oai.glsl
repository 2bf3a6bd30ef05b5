// gpt-oss's clamped SwiGLU of a gate and an up value (llama.cpp's swiglu_oai): the gate clamped
// from above, the up value on both sides, then (g * sigmoid(1.702 g)) * (u + 1). Shared by the
// fused expert mat-vecs (mul_mat_vec_base.glsl) and binary.comp's OP_SWIGLU_OAI.
#if !defined(GLU_OAI_GLSL)
#define GLU_OAI_GLSL
const float OAI_ALPHA = 1.702, OAI_LIMIT = 7.0;
float glu_oai(float g, float u) {
    g = min(g, OAI_LIMIT);
    return g / (1.0 + exp(-OAI_ALPHA * g)) * (clamp(u, -OAI_LIMIT, OAI_LIMIT) + 1.0);
}
#endif

#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"
// Where the device keeps the elements of 16 x 16 f16 cooperative matrices (Vulkan leaves it to the
// driver): one subgroup loads the matrix whose element (r, c) is 16 r + c as A and as B and writes
// element i of lane l as out[16 l + i] (A) and out[16 (SUBGROUP + l) + i] (B), -1 past the
// lane's count. kernels/fragments.py compares them with the layout mul_mat_coopmat_frag.comp takes.
layout(std430, binding = 0) writeonly buffer Out { float layout_out[]; };
shared float16_t index_sh[256];

void main() {
    const uint lane = gl_LocalInvocationID.x, lanes = gl_WorkGroupSize.x;
    for (uint i = lane; i < 256; i += lanes) {
        index_sh[i] = float16_t(i);
    }
    barrier();
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
    coopMatLoad(a, index_sh, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, index_sh, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
    for (uint i = 0; i < 16; i++) {
        layout_out[16 * lane + i] = i < a.length() ? float(a[i]) : -1.0;
        layout_out[16 * (lanes + lane) + i] = i < b.length() ? float(b[i]) : -1.0;
    }
}

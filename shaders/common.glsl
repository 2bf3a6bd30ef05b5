// Shared by every kernel: GLSL version, extensions and the workgroup size specialization.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

// Workgroup size is constant_id 0 for every kernel, so the host tunes it per device.
layout(local_size_x_id = 0, local_size_y = 1, local_size_z = 1) in;

// The dot product of 16 values, column c holding values 4c .. 4c + 3.
float dot16(mat4 a, mat4 b) {
    return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}

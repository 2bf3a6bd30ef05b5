"""Push constants packed by name: the layout read from the compiled SPIR-V must be the GLSL
block's (shaders/rms_norm.comp: `{ uint cols; float eps; }`, mul_mat.comp and
mul_mat_vec_base.glsl and mul_mmq.comp: the same six uints; their expert variants four more), and packing must
refuse what the block lacks."""
import struct

import pytest

from worker.engine import shaderbuild
from worker.engine.vk.spirv import PushError, PushField


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("spirv")


def test_layout_is_the_glsl_block(cache):
    push = shaderbuild.load_spirv("rms_norm", cache).push
    assert push.fields == (PushField("cols", 0, "I"), PushField("eps", 4, "f"))
    assert push.pack(dict(eps=0.5, cols=7)) == struct.pack("<If", 7, 0.5)


def test_mat_vec_and_mat_mat_share_one_block(cache):
    names = ("ncols", "rows", "n", "y_offset", "y_stride", "accumulate")
    for kernel in ("mul_mat_vec_q4_0", "mul_mat_q4_0", "mul_mat_vec_glu_q4_0", "mul_mat_cols_c8_q4_0",
                   "mul_mat_cols_glu_c2_q4_0", "mul_mmq_q4_0"):
        fields = shaderbuild.load_spirv(kernel, cache).push.fields
        assert fields == tuple(PushField(name, 4 * i, "I") for i, name in enumerate(names))


def test_expert_kernels_share_one_block(cache):
    """The mat-mat expert tiles (mul_mat_base.glsl's EXPERT_TILES) pack as the mat-vec ones
    (mul_mat_vec_base.glsl's EXPERTS): kernels/experts.py fills both from one dict."""
    names = ("ncols", "rows", "n", "y_offset", "y_stride", "accumulate", "n_used", "expert_first", "expert_count",
             "x_per_slot")
    for kernel in ("mul_mat_vec_id_tiles_q4_0", "mul_mat_id_tiles_q4_0", "mul_mat_id_bias_tiles_f16",
                   "mul_mmq_id_tiles_q4_0", "mul_mmq_id_bias_tiles_mxfp4"):
        fields = shaderbuild.load_spirv(kernel, cache).push.fields
        assert fields == tuple(PushField(name, 4 * i, "I") for i, name in enumerate(names)), kernel


@pytest.mark.parametrize("values, message", [
    (dict(cols=7), r"missing \['eps'\]"),
    (dict(cols=7, eps=0.5, rows=3), r"unknown \['rows'\]"),
    (dict(cols=-1, eps=0.5), "cols = -1"),
    (dict(cols=7.5, eps=0.5), "cols = 7.5"),
])
def test_packing_refuses_what_the_block_lacks(cache, values, message):
    with pytest.raises(PushError, match=message):
        shaderbuild.load_spirv("rms_norm", cache).push.pack(values)

"""Whether this device keeps the elements of 16 x 16 f16 cooperative matrices over a subgroup's
lanes the way mul_mat_coopmat_frag.comp builds them (NVIDIA's matrix units' layout): Vulkan
leaves the layout to the driver, so coopmat_layout.comp loads a matrix of known elements and
`nv_fragments` compares where each lane holds them, once per context."""
import weakref

import numpy as np

from worker.engine.kernels.paths import coopmat_shape

SUBGROUP = 32
_known = weakref.WeakKeyDictionary()   # context -> nv_fragments's answer


def expected_layout() -> tuple[np.ndarray, np.ndarray]:
    """(A, B): element i of lane l of a 16 x 16 matrix as 16 r + c of its (row r, column c), as
    mul_mat_coopmat_frag.comp's header gives them; A is rows x K, B K x columns."""
    a = np.zeros((SUBGROUP, 8), np.int64)
    b = np.zeros((SUBGROUP, 8), np.int64)
    for lane in range(SUBGROUP):
        g, t = divmod(lane, 4)
        for i in range(8):
            # K 2t.., 2t + 8.. of row (A) or column (B) g, then the same of g + 8
            k, rc = 2 * t + i % 2 + 8 * (i // 2 % 2), g + 8 * (i // 4)
            a[lane, i], b[lane, i] = 16 * rc + k, 16 * k + rc
    return a, b


def device_layout(ctx) -> tuple[np.ndarray, np.ndarray]:
    """coopmat_layout.comp's (A, B) on ctx's device: [lane, i] as expected_layout's, -1 past a
    lane's elements."""
    out = ctx.alloc(2 * SUBGROUP * 16 * 4)
    try:
        rec = ctx.recording()
        rec.dispatch(ctx.kernel("coopmat_layout", {0: SUBGROUP}), [out], (1, 1, 1), {})
        ctx.run(rec.finish())
        rec.destroy()
        values = ctx.download(out, np.float32, 2 * SUBGROUP * 16).reshape(2, SUBGROUP, 16)
    finally:
        ctx.free(out)
    return values[0].astype(np.int64), values[1].astype(np.int64)


def nv_fragments(ctx) -> bool:
    """Whether mul_mat_coopmat_frag.comp runs here: 16x16x16 f16 matrices over 32 lanes, laid out
    as it builds them (asked of the device once per context)."""
    if ctx not in _known:
        ok = ctx.info.subgroup_size == SUBGROUP and coopmat_shape(ctx.info) == (16, 16, 16)
        if ok:
            (a, b), (ea, eb) = device_layout(ctx), expected_layout()
            ok = bool((a[:, 8:] == -1).all() and (b[:, 8:] == -1).all() and (a[:, :8] == ea).all()
                      and (b[:, :8] == eb).all())
        _known[ctx] = ok
    return _known[ctx]

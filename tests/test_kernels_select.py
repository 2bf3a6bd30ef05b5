"""argmax and top-k on the real device against numpy (stable sorts give the tie order)."""
import numpy as np
import pytest

from tests.kernel_io import f32
from worker.engine.kernels import select


def test_argmax_rows_and_first_index_on_ties(dev):
    rng = np.random.default_rng(0)
    x = f32(rng, 4, 5003)
    x[1, [17, 900, 4000]] = 50.0        # ties: the first wins
    x[2, :] = -np.inf
    x[2, 4999] = -np.inf                # all equal: index 0
    x[3, -1] = 99.0                     # the last column
    out, scratch = dev.empty(16), dev.empty(select.scratch_bytes(dev.ctx, 4, 5003, 1))
    dev.run(lambda rec: select.argmax(rec, dev.put(x), out, 4, 5003, scratch))
    got = dev.get(out, np.uint32, 4)
    np.testing.assert_array_equal(got, np.argmax(x, axis=1))
    assert got.tolist()[1:] == [17, 0, 5002]


def test_argmax_vocab_sized_rows(dev):
    """Rows long enough for several chunks per row: the stages keep rows apart."""
    rng = np.random.default_rng(1)
    x = f32(rng, 3, 128256)
    x[1, [70000, 90000]] = 9.0
    out, scratch = dev.empty(12), dev.empty(select.scratch_bytes(dev.ctx, 3, x.shape[1], 1))
    dev.run(lambda rec: select.argmax(rec, dev.put(x), out, 3, x.shape[1], scratch))
    np.testing.assert_array_equal(dev.get(out, np.uint32, 3), np.argmax(x, axis=1))
    assert dev.get(out, np.uint32, 3)[1] == 70000


def _reference_topk(x, k):
    order = np.argsort(-x.astype(np.float64), kind="stable")[:k]  # descending, lower index first on ties
    return order, x[order]


@pytest.mark.parametrize("cols, k", [(49152, 40), (128256, 64), (300007, 64), (1000, 1), (37, 37), (5000, 64)])
def test_topk_sorted_descending(dev, cols, k):
    rng = np.random.default_rng(cols + k)
    x = f32(rng, cols)
    ids, vals = dev.empty(4 * k), dev.empty(4 * k)
    nbytes = select.scratch_bytes(dev.ctx, 1, cols, k)
    scratch = dev.empty(nbytes) if nbytes else None
    dev.run(lambda rec: select.topk(rec, dev.put(x), ids, vals, cols, k, scratch))
    want_ids, want_vals = _reference_topk(x, k)
    np.testing.assert_array_equal(dev.get(ids, np.uint32, k), want_ids)
    np.testing.assert_array_equal(dev.get(vals, count=k), want_vals)


def test_topk_rows(dev):
    """One top-k per logits row of a batched pass; the stages keep rows apart."""
    rng = np.random.default_rng(3)
    rows, cols, k = 3, 20000, 40
    x = f32(rng, rows, cols)
    ids, vals = dev.empty(4 * k * rows), dev.empty(4 * k * rows)
    scratch = dev.empty(select.scratch_bytes(dev.ctx, rows, cols, k))
    dev.run(lambda rec: select.topk(rec, dev.put(x), ids, vals, cols, k, scratch, rows))
    got_ids, got_vals = dev.get(ids, np.uint32, k * rows).reshape(rows, k), dev.get(vals, count=k * rows).reshape(rows, k)
    for r in range(rows):
        want_ids, want_vals = _reference_topk(x[r], k)
        np.testing.assert_array_equal(got_ids[r], want_ids)
        np.testing.assert_array_equal(got_vals[r], want_vals)


def test_topk_ties_across_chunks_keep_index_order(dev):
    """Equal values in different chunks and stages come out lowest index first."""
    rng = np.random.default_rng(7)
    x = np.round(f32(rng, 70001), 1)  # many exact ties
    x[[5, 40000, 69999, 20000]] = 7.0
    k = 50
    ids, vals, scratch = dev.empty(4 * k), dev.empty(4 * k), dev.empty(select.scratch_bytes(dev.ctx, 1, x.size, k))
    dev.run(lambda rec: select.topk(rec, dev.put(x), ids, vals, x.size, k, scratch))
    want_ids, want_vals = _reference_topk(x, k)
    np.testing.assert_array_equal(dev.get(ids, np.uint32, k), want_ids)
    np.testing.assert_array_equal(dev.get(vals, count=k), want_vals)
    assert dev.get(ids, np.uint32, 4).tolist() == [5, 20000, 40000, 69999]


def test_stages_without_enough_scratch_are_refused(dev):
    cols, k = 128256, 64
    need = select.scratch_bytes(dev.ctx, 1, cols, k)
    assert need > 0
    x, ids, vals = dev.empty(4 * cols), dev.empty(4 * k), dev.empty(4 * k)
    for scratch in (None, dev.empty(need // 2)):
        rec = dev.ctx.recording()
        try:
            with pytest.raises(ValueError, match="bytes of scratch"):
                select.topk(rec, x, ids, vals, cols, k, scratch)
        finally:
            rec.finish().destroy()


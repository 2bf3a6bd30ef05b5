"""mask_logits.comp against numpy and llguidance's own reference (llguidance.numpy)."""
import numpy as np
from llguidance.numpy import apply_token_bitmask_inplace

from tests.kernel_io import f32
from worker.engine.kernels.mask import mask_logits, mask_words


def _run(dev, logits, words):
    buf = dev.put(logits)
    dev.run(lambda rec: mask_logits(rec, buf, dev.put(words), logits.size))
    return dev.get(buf, count=logits.size)


def test_masked_logits_are_minus_infinity_and_the_rest_unchanged(dev):
    rng = np.random.default_rng(5)
    vocab = 49157   # not a multiple of 32: the last word is partly used
    logits = f32(rng, vocab)
    allowed = rng.random(vocab) < 0.1
    allowed[[0, 31, 32, vocab - 1]] = [True, False, True, True]
    words = np.packbits(np.concatenate([allowed, np.zeros(32 * mask_words(vocab) - vocab, bool)]),
                        bitorder="little").view(np.uint32)
    out = _run(dev, logits, words)
    np.testing.assert_array_equal(out, np.where(allowed, logits, -np.inf))
    expected = logits.copy()[None]
    apply_token_bitmask_inplace(expected, words.view(np.int32)[None])
    np.testing.assert_array_equal(out, expected[0])


def test_tokens_past_the_masks_words_are_masked(dev):
    logits = np.arange(100, dtype=np.float32)
    words = np.full(2, 0xFFFFFFFF, np.uint32)   # covers tokens 0..63
    out = _run(dev, logits, words)
    np.testing.assert_array_equal(out[:64], logits[:64])
    assert np.all(out[64:] == -np.inf)


def test_each_row_takes_its_own_mask(dev):
    """A batched pass masks each sequence's logits row with its own grammar's mask."""
    rng = np.random.default_rng(6)
    rows, vocab = 3, 333
    logits = f32(rng, rows, vocab)
    allowed = rng.random((rows, vocab)) < 0.3
    pad = np.zeros((rows, 32 * mask_words(vocab) - vocab), bool)
    words = np.packbits(np.concatenate([allowed, pad], axis=1), axis=1, bitorder="little").view(np.uint32)
    buf = dev.put(logits)
    dev.run(lambda rec: mask_logits(rec, buf, dev.put(words), vocab, rows))
    np.testing.assert_array_equal(dev.get(buf, count=logits.size).reshape(rows, vocab),
                                  np.where(allowed, logits, -np.inf))

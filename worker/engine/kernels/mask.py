"""Constrained generation's GPU side: a grammar's token mask applied to the logits in place,
so the argmax or top-k that follows picks only tokens the grammar allows, and the host uploads
vocab / 32 words per step instead of reading back the whole row (mask_logits.comp)."""
from worker.engine.intmath import cdiv
from worker.engine.kernels.launch import stride_groups, threads
from worker.engine.vk.commands import Recording
from worker.engine.vk.memory import Buffer


def mask_words(vocab: int) -> int:
    """uint32 words of a packed mask over `vocab` tokens (bit i % 32 of word i // 32: token i)."""
    return cdiv(vocab, 32)


def mask_logits(rec: Recording, logits: Buffer, mask: Buffer, vocab: int, rows: int = 1):
    """logits f32 [rows, vocab]: -inf where the bit of the row's mask (uint32 [rows,
    mask_words(vocab)]) is clear."""
    size = threads(rec.ctx)
    rec.dispatch(rec.ctx.kernel("mask_logits", {0: size}), [logits, mask],
                 (stride_groups(rec.ctx, vocab, size), rows, 1), dict(n=vocab, n_words=mask.size // 4))

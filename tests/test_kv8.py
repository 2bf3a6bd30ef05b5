"""The 8-bit KV cache (VKLLM_KV_TYPE=q8_0: q8_0-like blocks of 32 values and an f16 scale) against
the f16 cache and the numpy reference, on tiny synthetic models, prefill in chunks and decode
through the paged cache. Stated tolerance: logits within 3% of the largest logit from the f16
cache's (measured here: 1.2% on tiny-llama, 0.9% tiny-qwen2, 0.2% tiny-gemma3; the f16 cache is
within 0.2% of the reference), and the cache's memory (1 + 2/32) / 2 of f16's."""
import dataclasses

import numpy as np
import pytest
from refmodel import logits as reference_logits

from worker.engine.engine import Engine
from worker.engine.modelfile import ModelFile
from worker.tools.synth import write_model

Q8_TOLERANCE = 0.03


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_8bit_cache_logits_within_tolerance(vk_ctx, vk_settings, tmp_path, preset):
    path = write_model(preset, tmp_path / f"{preset}.gguf", mix="Q8_0", seed=1)
    ids = np.random.default_rng(7).integers(0, ModelFile.open(path).config.vocab_size, 24).tolist()
    ours = {}
    for kv_type in ("f16", "q8_0"):
        engine = Engine.load(path, dataclasses.replace(vk_settings, kv_type=kv_type, max_sequences=1), n_ctx=64,
                             ctx=vk_ctx, max_batch=8)
        try:
            # chunks of 8 from an empty cache, then the last 4 one by one
            engine.runner.prefill(ids[:20], 0, 8, select="logits")
            rows = [engine.runner.read_logits().copy()]
            for pos in range(20, 24):
                engine.runner.decode(ids[pos], pos, "logits")
                rows.append(engine.runner.read_logits().copy())
            ours[kv_type] = np.stack(rows)
            ours[kv_type + " bytes"] = engine.kv.stats()["kv_blocks_total"], sum(
                b.size for b in engine.kv._buffers)
        finally:
            engine.close()
    ref = reference_logits(ModelFile.open(path), ids)[19:]
    scale = np.abs(ref).max()
    assert np.abs(ours["f16"] - ref).max() < 2e-3 * scale
    err = np.abs(ours["q8_0"] - ours["f16"]).max() / scale
    assert err < Q8_TOLERANCE, f"8-bit KV logits {err:.2e} from f16's"
    assert np.abs(ours["q8_0"] - ref).max() < (Q8_TOLERANCE + 2e-3) * scale
    assert err > 1e-5   # the cache really is 8-bit
    (blocks16, bytes16), (blocks8, bytes8) = ours["f16 bytes"], ours["q8_0 bytes"]
    assert blocks16 == blocks8 and bytes8 / bytes16 == pytest.approx((1 + 2 / 32) / 2)


def test_batched_decode_over_the_8bit_cache_gives_what_each_gives_alone(vk_ctx, vk_settings, tmp_path):
    """Sequences of different lengths decoded together through the 8-bit cache: each token as
    the same sequence alone over the same cache type (the batch changes nothing but the pass)."""
    from worker.engine.batch import Request
    from worker.engine.sampling import SamplingParams
    path = write_model("tiny-qwen2", tmp_path / "tiny-qwen2.gguf", mix="Q8_0", seed=1)
    engine = Engine.load(path, dataclasses.replace(vk_settings, kv_type="q8_0", max_sequences=3), n_ctx=64,
                         ctx=vk_ctx, max_batch=8)
    try:
        rng = np.random.default_rng(3)
        requests = [Request(rng.integers(3, 300, n).tolist(), SamplingParams(temperature=0, max_tokens=m))
                    for n, m in ((3, 8), (19, 5), (10, 7))]
        alone = [[e.token_id for e in engine.generate_ids(r.ids, r.params) if e.token_id is not None]
                 for r in requests]
        seqs = [engine.batch.add(r, tag=i) for i, r in enumerate(requests)]
        got = [[] for _ in requests]
        while len(engine.batch):
            for seq, event in engine.batch.step():
                if event.token_id is not None:
                    got[seq.tag].append(event.token_id)
        assert got == alone and all(s.done for s in seqs)
    finally:
        engine.close()

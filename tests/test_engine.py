"""The GPU engine against the numpy reference forward pass (tests/refmodel.py) on tiny synthetic
models of every architecture and several quant mixes."""
import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest
from refmodel import RefModel
from refmodel import logits as reference_logits

from vkllm.errors import VkllmError
from worker.engine.engine import Engine
from worker.engine.errors import PromptTooLong
from worker.engine.modelfile import ModelFile
from worker.engine.sampling import SamplingParams
from worker.tools.synth import write_model

CASES = [("tiny-llama", "Q4_K_M"), ("tiny-llama", "Q8_0"), ("tiny-qwen2", "Q4_0"), ("tiny-qwen2", "Q5_K_M"),
         ("tiny-qwen3", "Q3_K_L"), ("tiny-qwen3", "Q4_K_M"),
         ("tiny-llama-bias", "Q4_K_M"),     # a `llama` file that carries q/k/v biases
         ("tiny-gemma3", "Q4_K_M"), ("tiny-gemma3", "Q5_0")]   # 11 tokens, past its 8-position window


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("synth")


def _model(synth_dir, preset, mix, seed=1):
    path = synth_dir / f"{preset}-{mix}-{seed}.gguf"
    if not path.exists():
        write_model(preset, path, mix=mix, seed=seed)
    return path


def reference_error(ctx, path, n_tokens: int, max_batch: int) -> float:
    """Max |engine - numpy reference| over max |reference| of the logits of n_tokens random
    tokens, prefilled in chunks of max_batch."""
    ids = np.random.default_rng(2).integers(0, ModelFile.open(path).config.vocab_size, n_tokens).tolist()
    engine = Engine.load(path, n_ctx=64, ctx=ctx, max_batch=max_batch)
    try:
        ours = engine.logits(ids)
    finally:
        engine.close()
    ref = reference_logits(ModelFile.open(path), ids)
    return np.abs(ours - ref).max() / np.abs(ref).max()


def assert_chunked_then_decoded(ctx, path, ids, ref, prefilled: int, chunk: int, tol: float):
    """ids[:prefilled] prefilled in chunks of `chunk`, the rest decoded one by one: the logits
    after each step are ref's (the reference's, one row per position) within tol."""
    engine = Engine.load(path, n_ctx=64, ctx=ctx, max_batch=chunk)
    try:
        engine.runner.prefill(ids[:prefilled], 0, chunk, select="logits")
        np.testing.assert_allclose(engine.runner.read_logits(), ref[prefilled - 1], atol=tol)
        for pos in range(prefilled, len(ids)):
            engine.runner.decode(ids[pos], pos)
            np.testing.assert_allclose(engine.runner.read_logits(), ref[pos], atol=tol)
    finally:
        engine.close()


@pytest.mark.parametrize("preset,mix", CASES)
def test_logits_match_numpy_reference(vk_ctx, synth_dir, preset, mix):
    err = reference_error(vk_ctx, _model(synth_dir, preset, mix), 11, 16)
    assert err < 2e-3, f"max relative logit error {err:.2e}"


@pytest.mark.parametrize("preset,mix", [("tiny-llama", "Q4_K_M"), ("tiny-gemma3", "Q4_K_M"), ("tiny-qwen3", "Q8_0")])
def test_logits_of_a_pass_of_40_tokens_match_numpy_reference(vk_ctx, synth_dir, preset, mix):
    """40 tokens in one pass: on a GPU with cooperative matrices past the mat-cols kernels' columns,
    so the cooperative-matrix products run, with the norm and the SwiGLU/GeGLU writing f16 for them
    (the tolerance leaves room for activations rounded to f16; lavapipe's path stays within 5e-4)."""
    err = reference_error(vk_ctx, _model(synth_dir, preset, mix), 40, 48)
    assert err < 5e-3, f"max relative logit error {err:.2e}"


def test_logits_of_more_tokens_than_one_pass_come_chunk_by_chunk(vk_ctx, synth_dir):
    """Engine.logits over 11 tokens with passes of 4: every position's row is the reference's."""
    err = reference_error(vk_ctx, _model(synth_dir, "tiny-llama", "Q8_0"), 11, 4)
    assert err < 2e-3, f"max relative logit error {err:.2e}"


def test_chunked_prefill_and_decode_match_one_pass(vk_ctx, synth_dir):
    """Prefill in chunks of 4 then decode token by token: the last logits equal a single pass."""
    path = _model(synth_dir, "tiny-qwen2", "Q4_0")
    ids = np.random.default_rng(3).integers(0, 300, 13).tolist()
    ref = reference_logits(ModelFile.open(path), ids)
    engine = Engine.load(path, n_ctx=64, ctx=vk_ctx, max_batch=4)
    try:
        engine.runner.prefill(ids[:10], 0, 4)
        for pos in range(10, 13):
            engine.runner.decode(ids[pos], pos)
            got = engine.runner.read_logits()
            np.testing.assert_allclose(got, ref[pos], atol=2e-3 * np.abs(ref).max())
        assert engine.runner.read_argmax() == int(np.argmax(ref[12]))
    finally:
        engine.close()


def test_generate_greedy_matches_reference_argmax(vk_ctx, synth_dir):
    path = _model(synth_dir, "tiny-llama", "Q8_0")
    engine = Engine.load(path, n_ctx=64, ctx=vk_ctx, max_batch=16)
    model_file = ModelFile.open(path)
    try:
        prompt = engine.tokenizer.encode("hello world")
        events = list(engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_tokens=6)))
        tokens = [e.token_id for e in events if e.token_id is not None]
        ids = list(prompt)
        for token in tokens:  # each generated token is the reference's argmax given the text so far
            assert token == int(np.argmax(reference_logits(model_file, ids)[-1]))
            ids.append(token)
        assert events[-1].finish_reason in ("length", "stop")
        assert events[-1].timings.prompt_tokens == len(prompt)
    finally:
        engine.close()


@pytest.mark.parametrize("contexts", [1, 2])
def test_greedy_steps_ahead_of_the_caller_leave_the_cache_right(vk_ctxs, synth_dir, contexts):
    """Greedy decode queues each step before the caller has taken the previous token, so a caller
    that stops early (max_tokens, a stop string, cancellation) leaves a step done for nothing.
    What later prompts reuse of the cache must still be exact: the numpy reference's greedy
    continuation, after an early stop, a cancellation and a prompt extending a cut generation;
    unsplit, and split across two contexts (the host handing each token to the first stage)."""
    from refmodel import RefModel
    path = _model(synth_dir, "tiny-llama", "Q8_0")
    model_file = ModelFile.open(path)
    engine = Engine.load(path, n_ctx=64, ctx=vk_ctxs[:contexts], max_batch=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    try:
        prompt = engine.tokenizer.encode("the cache after an early stop")
        expected = RefModel(model_file).greedy(prompt, 10)

        def run(ids, params=greedy, cancelled=lambda: False):
            return [e.token_id for e in engine.generate_ids(ids, params, cancelled) if e.token_id is not None]

        assert run(prompt, SamplingParams(temperature=0.0, max_tokens=3)) == expected[:3]
        seen = []
        assert run(prompt, cancelled=lambda: len(seen.append(0) or seen) >= 5) == expected[:5]
        assert run(prompt + expected[:4]) == expected[4:10] + RefModel(model_file).greedy(prompt + expected, 4)
        assert run(prompt) == expected
    finally:
        engine.close()


def test_prompt_longer_than_context_is_refused(vk_ctx, synth_dir):
    engine = Engine.load(_model(synth_dir, "tiny-llama", "Q8_0"), n_ctx=16, ctx=vk_ctx, max_batch=8)
    try:
        with pytest.raises(PromptTooLong, match="context is 16"):
            list(engine.generate_ids(list(range(20)), SamplingParams(max_tokens=2)))
        with pytest.raises(VkllmError, match="empty"):
            list(engine.generate_ids([], SamplingParams(max_tokens=2)))
    finally:
        engine.close()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.0, seed=5, max_tokens=5),     # GPU top-k
    SamplingParams(temperature=0.9, top_k=0, top_p=0.95, seed=7, max_tokens=5),                # all logits
    SamplingParams(temperature=0.0, repeat_penalty=1.3, seed=1, max_tokens=5),                 # penalties
], ids=["topk", "logits", "penalties"])
def test_seeded_sampling_matches_sampler_on_reference_logits(vk_ctx, synth_dir, params):
    """Whichever readback the engine picks, a seeded run draws what the same sampler draws
    from the numpy reference's full logits."""
    from worker.engine.sampling import Sampler
    path = _model(synth_dir, "tiny-llama", "Q8_0")
    model_file = ModelFile.open(path)
    engine = Engine.load(path, n_ctx=64, ctx=vk_ctx, max_batch=16)
    try:
        prompt = engine.tokenizer.encode("once upon a time")
        ours = [e.token_id for e in engine.generate_ids(prompt, params) if e.token_id is not None]
        again = [e.token_id for e in engine.generate_ids(prompt, params) if e.token_id is not None]
    finally:
        engine.close()
    assert ours == again  # same seed, same inputs, same tokens (the second run reuses the KV prefix)
    sampler, ids = Sampler(params, model_file.config.vocab_size), list(prompt)
    for token in ours:
        assert token == sampler.sample(reference_logits(model_file, ids)[-1].astype(np.float32), ids)
        ids.append(token)


GOLDEN = np.load(Path(__file__).parent / "golden" / "refmodel" / "tiny.npz")
GOLDEN_CASES = sorted({tuple(k.split("__")[:2]) for k in GOLDEN.files})


@pytest.mark.parametrize("preset,mix", GOLDEN_CASES)
def test_tiny_models_match_llama_cpp(vk_ctx, synth_dir, preset, mix):
    """Every architecture and every quant type through the GPU engine against llama-cpp-python
    (tests/golden/refmodel/tiny.npz): llama.cpp in float32 on the same weights ("exact") for the
    logits, and its greedy continuation, which may part from ours only where its two best logits
    are within 0.05 (random tiny models have such near-ties)."""
    key = f"{preset}__{mix}__"
    path = write_model(preset, synth_dir / f"golden-{preset}-{mix}.gguf", mix=mix, seed=0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(GOLDEN[key + "sha256"])
    ids = GOLDEN[key + "tokens"].tolist()
    engine = Engine.load(path, n_ctx=96, ctx=vk_ctx, max_batch=64)
    try:
        last = engine.logits(ids)[-1]
        greedy = [e.token_id for e in engine.generate_ids(ids, SamplingParams(temperature=0.0, max_tokens=8))
                  if e.token_id is not None]
    finally:
        engine.close()
    exact = GOLDEN[key + "exact_last"]
    assert np.abs(last - exact).max() < 2e-3 * np.abs(exact).max()
    expected, top2 = GOLDEN[key + "exact_greedy"].tolist(), GOLDEN[key + "exact_top2"]
    for step, (a, b) in enumerate(zip(greedy + [None], expected)):
        if a != b:
            assert a is None and b in engine.tokenizer.eog_ids or top2[step, 0] - top2[step, 1] < 0.05, \
                f"greedy {greedy} parts from llama.cpp's {expected} at step {step}"
            break


def test_sliding_window_in_chunked_prefill_and_decode(vk_ctx, synth_dir):
    """tiny-gemma3 (local layers over 8 positions): 20 tokens prefilled in chunks of 4, then
    decoded one by one, give the reference's logits at every step; the reference without the
    window differs, so the mask is what makes them agree."""
    path = _model(synth_dir, "tiny-gemma3", "Q8_0")
    model_file = ModelFile.open(path)
    ids = np.random.default_rng(5).integers(0, model_file.config.vocab_size, 24).tolist()
    ref = reference_logits(model_file, ids)
    no_window_model = RefModel(model_file)
    no_window_model.cfg = dataclasses.replace(no_window_model.cfg, swa_layers=())
    no_window = no_window_model.logits(ids)
    tol = 2e-3 * np.abs(ref).max()
    assert np.abs(no_window[-1] - ref[-1]).max() > 50 * tol
    assert_chunked_then_decoded(vk_ctx, path, ids, ref, 20, 4, tol)


def test_close_returns_the_models_memory(vk_ctx, synth_dir):
    """Engines sharing a context (as a worker serving several models does) give back what they took."""
    path = _model(synth_dir, "tiny-qwen3", "Q4_K_M")
    params = SamplingParams(temperature=0.7, top_k=10, seed=0, max_tokens=3)

    def load_run_close():
        engine = Engine.load(path, n_ctx=64, ctx=vk_ctx, max_batch=16)
        list(engine.generate("hello", params))
        engine.close()

    load_run_close()  # kernels' own scratch (attention partials, top-k) is made once per context
    before = (vk_ctx.device_pool.used, vk_ctx.host_pool.used)
    load_run_close()
    assert (vk_ctx.device_pool.used, vk_ctx.host_pool.used) == before


def test_stop_strings_cut_the_text_and_release_what_did_not_match(vk_ctx, synth_dir):
    engine = Engine.load(_model(synth_dir, "tiny-llama", "Q8_0"), n_ctx=64, ctx=vk_ctx, max_batch=16)
    try:
        prompt = engine.tokenizer.encode("the story so far")
        greedy = SamplingParams(temperature=0.0, max_tokens=12)
        full_events = list(engine.generate_ids(prompt, greedy))
        full = "".join(e.text for e in full_events)
        assert len(full) > 6, full
        stop = full[3:6]
        cut = list(engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop=(stop,))))
        assert "".join(e.text for e in cut) == full[:full.index(stop)] and cut[-1].finish_reason == "stop"
        # a stop string that starts like the end of the text but never completes: nothing is lost
        unmatched = full[-1] + "\x00"
        kept = list(engine.generate_ids(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop=(unmatched,))))
        assert "".join(e.text for e in kept) == full
        assert kept[-1].finish_reason == full_events[-1].finish_reason
    finally:
        engine.close()

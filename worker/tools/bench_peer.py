"""llama.cpp's Vulkan backend as the peer in `vkllm bench --peer llama.cpp` and `vkllm bench serve
--peer llama.cpp`, through the cyllama package (cyllama-vulkan): the same file, the same token
counts (the same prompts), timed in the same process run."""
import statistics
import time

import numpy as np

from vkllm.errors import VkllmError


def time_llama_cpp(path: str, vocab_size: int, n_prompt: int, n_gen: int, reps: int, n_ctx: int) -> dict:
    cy = _cyllama()
    model_params = cy.LlamaModelParams()
    model_params.n_gpu_layers = 999
    model = cy.LlamaModel(str(path), model_params)
    ctx_params = cy.LlamaContextParams()
    ctx_params.n_ctx = n_ctx
    ctx_params.n_batch = ctx_params.n_ubatch = min(512, n_prompt)
    ctx = cy.LlamaContext(model, ctx_params)
    tokens = np.random.default_rng(0).integers(0, vocab_size, n_prompt).tolist()
    pp, tg = [], []
    for _ in range(reps + 1):  # the first is a warm-up
        ctx.kv_cache_clear()
        start = time.perf_counter()
        for i in range(0, n_prompt, ctx_params.n_batch):
            ctx.decode(cy.llama_batch_get_one(tokens[i:i + ctx_params.n_batch], i))
        ctx.synchronize()
        pp.append(n_prompt / (time.perf_counter() - start))
        ctx.kv_cache_clear()
        start = time.perf_counter()
        for pos in range(n_gen):
            ctx.decode(cy.llama_batch_get_one([tokens[pos % n_prompt]], pos))
            ctx.synchronize()
        tg.append(n_gen / (time.perf_counter() - start))
    return {"pp": statistics.median(pp[1:]), "tg": statistics.median(tg[1:])}


def serve_llama_cpp(path: str, prompts: list[list[int]], n_gen: int) -> list[tuple]:
    """`vkllm bench serve --peer llama.cpp`: the same prompts as parallel sequences of one context
    (llama.cpp server's slots): every prompt prefilled (chunks of 512 tokens, several sequences
    per chunk), then one decode per step for every sequence, greedy, n_gen tokens each. Returns
    per prompt (submitted, first token, ended, prompt tokens, output tokens), monotonic seconds."""
    cy = _cyllama()
    model_params = cy.LlamaModelParams()
    model_params.n_gpu_layers = 999
    model = cy.LlamaModel(str(path), model_params)
    ctx_params = cy.LlamaContextParams()
    ctx_params.n_ctx = sum(len(p) + n_gen for p in prompts) + 16
    ctx_params.n_seq_max, ctx_params.kv_unified = len(prompts), True
    ctx_params.n_batch = ctx_params.n_ubatch = 512
    ctx = cy.LlamaContext(model, ctx_params)
    sampler = cy.LlamaSampler()
    sampler.add_greedy()
    batch = cy.LlamaBatch(n_tokens=max(512, len(prompts)), embd=0, n_seq_max=1)
    _generate(ctx, sampler, batch, [p[:8] for p in prompts], 16)   # a warm-up: the GPU idles at a low clock
    ctx.kv_cache_clear()
    return _generate(ctx, sampler, batch, prompts, n_gen)


def _generate(ctx, sampler, batch, prompts: list[list[int]], n_gen: int) -> list[tuple]:
    submitted = time.monotonic()
    pending = [(seq, pos, token) for seq, ids in enumerate(prompts) for pos, token in enumerate(ids)]
    last = {seq: len(ids) - 1 for seq, ids in enumerate(prompts)}
    first, tokens = {}, {}
    while pending:   # prefill
        batch.clear()
        chunk, pending = pending[:512], pending[512:]
        for seq, pos, token in chunk:
            batch.add(token, pos, [seq], pos == last[seq])
        ctx.decode(batch)
        for i, (seq, pos, _) in enumerate(chunk):
            if pos == last[seq]:
                tokens[seq] = [sampler.sample(ctx, i)]
                first[seq] = time.monotonic()
    for step in range(1, n_gen):   # decode: one token of every sequence per step
        batch.clear()
        for seq, ids in enumerate(prompts):
            batch.add(tokens[seq][-1], len(ids) + step - 1, [seq], True)
        ctx.decode(batch)
        for seq in range(len(prompts)):
            tokens[seq].append(sampler.sample(ctx, seq))
    now = time.monotonic()
    return [(submitted, first[seq], now, len(ids), len(tokens[seq])) for seq, ids in enumerate(prompts)]


def _cyllama():
    try:
        from cyllama.llama import llama_cpp as cy
    except ImportError:
        raise VkllmError("the peer needs cyllama-vulkan (pip install cyllama-vulkan)") from None
    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    return cy

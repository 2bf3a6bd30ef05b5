"""llama.cpp's Vulkan backend as the peer in `vkllm bench --peer llama.cpp`, through the cyllama
package (cyllama-vulkan): the same file, the same token counts, timed in the same process run."""
import statistics
import time

import numpy as np

from vkllm.errors import VkllmError


def time_llama_cpp(path: str, vocab_size: int, n_prompt: int, n_gen: int, reps: int) -> dict:
    try:
        from cyllama.llama import llama_cpp as cy
    except ImportError:
        raise VkllmError("the peer needs cyllama-vulkan (pip install cyllama-vulkan)") from None
    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    model_params = cy.LlamaModelParams()
    model_params.n_gpu_layers = 999
    model = cy.LlamaModel(str(path), model_params)
    ctx_params = cy.LlamaContextParams()
    ctx_params.n_ctx = n_prompt + n_gen + 16
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

"""Write tests/golden/refmodel/moe.npz from llama.cpp's CPU build (xllamacpp, in the venv):
the tiny mixture-of-experts presets through llama.cpp, for tests/test_engine_moe.py.

    python tests/tools/make_moe_goldens.py

Per preset and mix of MOE_CASES (seed 0): the file's sha256 (the generator must reproduce it),
the prompt (PROMPT_LEN random token ids, past tiny-gpt-oss's 8-position window), and llama.cpp's
greedy continuation of GREEDY_STEPS tokens with the log-probabilities of the whole vocabulary at
every step (n_probs = vocabulary size: its full distribution, the first step's being the last
prompt position's). As make_refmodel_goldens.py's "exact" run, llama.cpp runs a copy of the file
with every tensor dequantized to F32 (gguf.quants) and an F32 KV cache, so that it computes in
float32 over the same weights (its quantized matmuls would round activations to 8 bits first).
"""
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np
import xllamacpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.tools.f32copy import dequantized_copy  # noqa: E402
from worker.engine.modelfile import ModelFile  # noqa: E402
from worker.tools.synth import write_model  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "refmodel" / "moe.npz"
MOE_CASES = (("tiny-qwen3moe", "Q4_K_M"), ("tiny-qwen3moe", "Q8_0"), ("tiny-qwen2moe", "Q4_K_M"), ("tiny-qwen2moe", "F32"),
             ("tiny-gpt-oss", "MXFP4_MOE"), ("tiny-gpt-oss", "F32"), ("tiny-gpt-oss-yarn", "F32"))
PROMPT_LEN = 24
GREEDY_STEPS = 8


def run_llama_cpp(path: Path, prompt: list[int], vocab: int, ascii_token: int) -> tuple[np.ndarray, np.ndarray]:
    """(greedy tokens [GREEDY_STEPS], log-probabilities [GREEDY_STEPS, vocab]) from llama.cpp.
    One request per step, each generating one token: the server withholds a token that ends
    inside a UTF-8 character, and its probabilities with it, so a logit bias makes every reply's
    token `ascii_token`; the probabilities it reports are of the raw logits, before any sampler,
    and the greedy token is their argmax."""
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 128
    params.cache_type_k = params.cache_type_v = xllamacpp.ggml_type.GGML_TYPE_F32
    params.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_DISABLED  # its CPU kernel rounds q to f16
    params.cpuparams.n_threads = 1
    server = xllamacpp.Server(params)
    tokens, logprobs = [], np.full((GREEDY_STEPS, vocab), -np.inf, dtype=np.float32)
    for i in range(GREEDY_STEPS):
        reply = server.handle_completions({"prompt": prompt + tokens, "max_tokens": 1, "temperature": 0,
                                           "n_probs": vocab, "ignore_eos": True, "cache_prompt": False,
                                           "logit_bias": [[ascii_token, 1000.0]]})
        assert reply["usage"]["prompt_tokens"] == len(prompt) + i, reply["usage"]
        (step,) = reply["choices"][0]["logprobs"]["content"]
        assert step["id"] == ascii_token
        for candidate in step["top_logprobs"]:
            logprobs[i, candidate["id"]] = candidate["logprob"]
        tokens.append(int(logprobs[i].argmax()))
    return np.array(tokens, dtype=np.int32), logprobs


def main() -> None:
    data = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset, mix in MOE_CASES:
            path = write_model(preset, Path(tmp) / f"{preset}-{mix}.gguf", mix, seed=0)
            model = ModelFile.open(path)
            vocab = model.config.vocab_size
            ascii_token = list(model.metadata["tokenizer.ggml.tokens"]).index("a")
            prompt = np.random.default_rng(7).integers(0, vocab, PROMPT_LEN).astype(np.int32)
            exact = dequantized_copy(path, Path(tmp) / f"{preset}-{mix}-f32.gguf")
            tokens, logprobs = run_llama_cpp(exact, prompt.tolist(), vocab, ascii_token)
            key = f"{preset}__{mix}__"
            data |= {key + "sha256": np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
                     key + "tokens": prompt, key + "greedy": tokens, key + "logprobs": logprobs}
    np.savez_compressed(GOLDEN, **data)


if __name__ == "__main__":
    main()

"""Write tests/golden/refmodel/*.npz from llama-cpp-python (CPU, default f16 KV cache).

    python tests/tools/make_refmodel_goldens.py [MODELS_DIR] [--tiny PRESET ...]
    python tests/tools/make_refmodel_goldens.py --gemma3 gemma-3-270m-q4_k_m.gguf

With --tiny, only those tiny presets are run, their entries replacing the ones in tiny.npz (the
rest of the file and smollm2.npz are left as they are). With --gemma3, only gemma3_270m.npz is
written, from that file (tests/conftest.py's gemma3_270m_path fetches it).

Two llama.cpp runs per model:
- as shipped (`last`, `greedy`, `top2`): the quantized file with llama.cpp's defaults. Its CPU
  matmuls quantize activations to 8 bits, which moves logits by up to ~0.4 on the tiny models
  and ~1.5 on SmolLM2 against exact maths.
- exact (`exact_*`): a copy of the file with every tensor dequantized to F32 (by gguf.quants)
  and an F32 KV cache, so llama.cpp computes in float32 throughout: this checks a float
  forward pass over the dequantized weights to ~1e-4.
smollm2.npz: per prompt of SMOLLM2_PROMPTS: token ids (llama.cpp's tokenizer), last-position
logits (float16; exact ones float32 for prompts 0 and 2), 16-token greedy continuations with the
top-2 logits at each step (so a test can accept a divergence where the best two nearly tie).
Prompt 4 also has exact logits at every position for 1024 sampled vocabulary ids.
tiny.npz: per tiny preset and mix (seed 0): the file's sha256 (the generator must reproduce
it), prompt tokens, last-position logits and 8-token greedy continuations; Q4_K_M files also
exact logits at every position.
gemma3_270m.npz: as smollm2.npz for GEMMA3_PROMPTS (the last one longer than the model's
512-position sliding window); last-position logits (float16) exact for prompts 2 and 4, as
shipped for prompt 4 (262144 of them each: the file stays small).
Needs llama-cpp-python; tests only read the .npz files.
"""
import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.tools.f32copy import dequantized_copy  # noqa: E402
from vkllm.demo import fetch_demo  # noqa: E402
from worker.tools.synth import write_model  # noqa: E402

GOLDEN = ROOT / "tests" / "golden" / "refmodel"
SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n")
SMOLLM2_PROMPTS = [
    SMOL_SYSTEM + "<|im_start|>user\nWhat is the largest planet in our solar system?<|im_end|>\n"
    "<|im_start|>assistant\n",
    SMOL_SYSTEM + "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
]
_COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "silver")
_ANIMALS = ("fox", "owl", "badger", "heron", "otter", "lynx", "mole", "crow", "hare", "stoat", "wren")
_PLACES = ("river", "old mill", "market", "hill", "lighthouse")
# Sentences that never repeat as a whole, so the continuation needs more than copying.
LONG_PROMPT = "".join(f"{i}. The {_COLORS[i % 7]} {_ANIMALS[i % 11]} walked to the {_PLACES[i % 5]} and "
                      f"counted {i * 37 % 100} stones.\n" for i in range(1, 45)) + "45. The"
GEMMA3_PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):\n",
    "<start_of_turn>user\nWhat is the largest planet in our solar system?<end_of_turn>\n"
    "<start_of_turn>model\n",
    "Once upon a time, in a small village,",
    LONG_PROMPT,
]
TINY_MIXES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
              "Q4_K", "Q5_K", "Q6_K", "MXFP4", "Q4_K_M", "Q5_K_M", "Q3_K_L")
# preset -> mixes; tiny-llama-bias (a llama file with q/k/v biases) and tiny-gemma3 need no full
# sweep of types
TINY_PRESETS = {"tiny-llama": TINY_MIXES, "tiny-qwen2": TINY_MIXES, "tiny-qwen3": TINY_MIXES,
                "tiny-llama-bias": ("F32", "Q8_0", "Q4_K_M"),
                # the types of gemma-3-270m's Q4_K_M file, each alone and as its mix
                "tiny-gemma3": ("F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "Q4_K_M")}
TINY_PROMPT = b"The weather is nice, so we will go for a walk in the park."


def greedy(llm: Llama, tokens: list[int], n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(last prompt logits, n greedy tokens, their top-2 logits)."""
    llm.reset()
    llm.eval(tokens)
    first = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    out, top2 = [], []
    for _ in range(n):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        out.append(int(logits.argmax()))
        top2.append(np.sort(logits)[::-1][:2])
        llm.eval([out[-1]])
    return first, np.array(out, dtype=np.int32), np.array(top2, dtype=np.float32)


def runs(path: Path, tmp: str, n_ctx: int):
    """(as shipped, exact) llama.cpp instances for the file."""
    exact = dequantized_copy(path, Path(tmp) / f"{path.stem}-f32.gguf")
    return (Llama(str(path), n_ctx=n_ctx, logits_all=True, verbose=False, seed=0),
            Llama(str(exact), n_ctx=n_ctx, logits_all=True, verbose=False, seed=0, type_k=0, type_v=0))


def smollm2(models_dir: Path) -> dict:
    data = {"prompts": np.array(SMOLLM2_PROMPTS)}
    with tempfile.TemporaryDirectory() as tmp:
        shipped, exact = runs(fetch_demo(models_dir), tmp, 512)
        for i, prompt in enumerate(SMOLLM2_PROMPTS):
            tokens = shipped.tokenize(prompt.encode(), add_bos=False, special=True)
            last, cont, top2 = greedy(shipped, tokens, 16)
            e_last, e_cont, e_top2 = greedy(exact, tokens, 16)
            data |= {f"p{i}_tokens": np.array(tokens, dtype=np.int32),
                     f"p{i}_last": last.astype(np.float16), f"p{i}_greedy": cont, f"p{i}_top2": top2,
                     f"p{i}_exact_greedy": e_cont, f"p{i}_exact_top2": e_top2}
            if i in (0, 2):
                data[f"p{i}_exact_last"] = e_last
            if i == 4:      # every position (logits_all), on a fixed sample of the vocabulary
                ids = np.sort(np.random.default_rng(0).choice(len(e_last), 1024, replace=False))
                every = np.array(exact.scores[:len(tokens)], dtype=np.float32)
                data |= {"p4_exact_all_ids": ids.astype(np.int32), "p4_exact_all": every[:, ids],
                         "p4_exact_all_argmax": every.argmax(-1).astype(np.int32)}
        del shipped, exact
    return data


def gemma3_270m(path: Path) -> dict:
    data = {"prompts": np.array(GEMMA3_PROMPTS)}
    with tempfile.TemporaryDirectory() as tmp:
        shipped, exact = runs(path, tmp, 1024)
        for i, prompt in enumerate(GEMMA3_PROMPTS):
            tokens = shipped.tokenize(prompt.encode(), add_bos=True, special=True)
            last, cont, top2 = greedy(shipped, tokens, 16)
            e_last, e_cont, e_top2 = greedy(exact, tokens, 16)
            data |= {f"p{i}_tokens": np.array(tokens, dtype=np.int32),
                     f"p{i}_greedy": cont, f"p{i}_top2": top2,
                     f"p{i}_exact_greedy": e_cont, f"p{i}_exact_top2": e_top2}
            if i in (2, 4):
                data[f"p{i}_exact_last"] = e_last.astype(np.float16)
            if i == 4:
                data[f"p{i}_last"] = last.astype(np.float16)
        del shipped, exact
    return data


def tiny(presets) -> dict:
    data = {}
    with tempfile.TemporaryDirectory() as tmp:
        for preset in presets:
            for mix in TINY_PRESETS[preset]:
                path = write_model(preset, Path(tmp) / f"{preset}-{mix}.gguf", mix, seed=0)
                shipped, exact = runs(path, tmp, 128)
                tokens = shipped.tokenize(TINY_PROMPT)
                last, cont, top2 = greedy(shipped, tokens, 8)
                e_last, e_cont, e_top2 = greedy(exact, tokens, 8)
                key = f"{preset}__{mix}__"
                data |= {key + "sha256": np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
                         key + "tokens": np.array(tokens, dtype=np.int32), key + "last": last,
                         key + "greedy": cont, key + "top2": top2, key + "exact_last": e_last,
                         key + "exact_greedy": e_cont, key + "exact_top2": e_top2}
                if mix == "Q4_K_M":     # every position (logits_all)
                    data[key + "exact_all"] = np.array(exact.scores[:len(tokens)], dtype=np.float32)
                del shipped, exact
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models_dir", nargs="?", type=Path, default=Path(tempfile.gettempdir()) / "vkllm-models")
    parser.add_argument("--tiny", nargs="+", choices=sorted(TINY_PRESETS), help="only these tiny presets")
    parser.add_argument("--gemma3", type=Path, help="only gemma3_270m.npz, from this gemma-3-270m Q4_K_M file")
    args = parser.parse_args()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    if args.gemma3:
        np.savez_compressed(GOLDEN / "gemma3_270m.npz", **gemma3_270m(args.gemma3))
        return
    if args.tiny:
        kept = {k: v for k, v in np.load(GOLDEN / "tiny.npz").items() if k.split("__")[0] not in args.tiny}
        np.savez_compressed(GOLDEN / "tiny.npz", **kept, **tiny(args.tiny))
        return
    np.savez_compressed(GOLDEN / "smollm2.npz", **smollm2(args.models_dir))
    np.savez_compressed(GOLDEN / "tiny.npz", **tiny(TINY_PRESETS))


if __name__ == "__main__":
    main()

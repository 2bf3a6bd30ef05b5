"""Writes the tokenizer goldens in tests/golden/tokenizer/ from llama-cpp-python.

    python tests/tools/make_tokenizer_goldens.py --smollm2 PATH/SmolLM2-135M-Instruct.Q4_1.gguf \
        --llama-cpp-models LLAMA_CPP_SOURCE/models

The vocabularies: SmolLM2 (byte-level BPE, pre-tokenizer "smollm"); real ones from llama.cpp's
models/ggml-vocab-*.gguf (Llama 3, Qwen2, Llama 2 SentencePiece, GPT-2, StarCoder; the tests
fetch that folder from the llama-cpp-python source archive, see the llama_cpp_models fixture);
and small vocabulary-only GGUFs
written here: SentencePiece with byte fallback and user-defined tokens, and byte-level BPE with
the llama-bpe, qwen2, deepseek-r1-qwen and default pre-tokenizers, their merges learned from
TRAINING_TEXT. For each vocabulary llama.cpp tokenizes CORPUS (ids and detokenized bytes) and
reports its special tokens; the tests compare our tokenizer with these files.

llama-cpp-python is imported where it is used, so that tests/tools/make_gpt4o_golden.py (which
runs llama.cpp through xllamacpp instead) can share the corpus and the vocabulary writer.

Chat templates (SmolLM2's and real models' from llama.cpp's models/templates/) are rendered by
llama-cpp-python's Jinja2 formatter into smollm2_chat.json and chat_templates.json.

Decoded text is llama-cpp-python's `Llama.detokenize` rule (pieces of
`llama_token_to_piece(special=False)` joined, one leading space dropped after BOS) computed
here with a large buffer: `detokenize` itself uses a 32-byte buffer and loses longer pieces.
"""
import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

import gguf
import regex

OUT = Path(__file__).resolve().parents[1] / "golden" / "tokenizer"
LLAMA_CPP_VOCABS = ("llama-bpe", "qwen2", "llama-spm", "gpt-2", "starcoder")

CORPUS = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ", "\r\n", " \n", "a\n\n\n\nb", "\n\n  \n  x",
    "Hello world", " Hello world", "Hello  world   spaces    ", "   leading spaces", "trailing spaces   ",
    "hello\nworld\r\nwindows\rmac", "tabs\t\t\tand\t spaces", "word\u2028line\u2029para",
    "I'm don't you're we've they'll she'd IT'S I'M DON'T WE'VE", "'s 't 'quoted' rock'n'roll",
    "1234567", "3.14159 and 1,000,000 and 007 and 12345678901234567890",
    "½ ² ٣٤٥ ३४ Ⅻ ①②", "The quick brown fox jumps over the lazy dog.",
    "def f(a, b):\n    return a**2 + b  # square\n\n\nclass X:\n\tpass\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "<div class=\"x\">&amp; <b>bold</b></div>", "x += 1;  // comment\ny = x >> 2 | 0xFF;",
    "😀👍🏽👨‍👩‍👧‍👦🇫🇷 ❤️ 🤖", "日本語のテキストと漢字。中文测试，你好世界！한국어 텍스트",
    "café naïve résumé Ångström Zürich São Paulo e\u0301 n\u0303",
    "Привет мир! Γειά σου Κόσμε. مرحبا بالعالم שלום עולם नमस्ते दुनिया ภาษาไทย",
    "a\u00a0b\u3000c\u2003d\u200be\u200df", "!!!??? ... --- *** ___", "$100 + 50% = <tag> ^_^ ~|~ `code`",
    "email@example.com https://example.com/path?q=1&r=2#frag", "\x1b[31m red \x7f del \x0c ff",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "ſ long s, \u212a kelvin, ﬁ ligature, Ⓐ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|>", "<|im_start", "text<|endoftext|>more", "<s>hello</s> <s> </s>",
    "<think>reasoning</think> <sep>", "<|unknown|> <unk>", " <|im_end|> spaced ",
]
# A few KB of everything at once: long inputs must tokenize the same as short ones.
CORPUS.append("\n".join(CORPUS) * 3)

TRAINING_TEXT = "\n".join([
    "The quick brown fox jumps over the lazy dog. Hello world, hello there, the world is wide.",
    "I'm sure they're here; we've seen them and they'll stay. Don't worry, it's fine.",
    "def main():\n    print('hello world')\n    return 0\n\nif __name__ == '__main__':\n    main()\n",
    "for (int i = 0; i < 10; i++) {\n\tsum += i;\n}\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14",
    "Zürich café résumé naïve. 日本語 中文 你好 世界 한국어.",
    "    indented line\n        more indented\n\n\nblank lines above",
]) * 4

WORD = regex.compile(r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")


def byte_chars() -> list[str]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def learn_merges(words: list[list[str]], n_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: repeatedly merge the most frequent pair (ties: smallest pair)."""
    counts = Counter(tuple(w) for w in words)
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, c in counts.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = Counter()
        for word, c in counts.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += c
        counts = merged
    return merges


def shape_keys(w: gguf.GGUFWriter) -> None:
    """Hyperparameters llama.cpp reads even when it loads only the vocabulary."""
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)


def write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_bpe(path: Path, arch: str, pre: str, text: str = TRAINING_TEXT, word: regex.Pattern = WORD) -> None:
    """A byte-level BPE vocabulary whose merges are learned from `text` split by `word`."""
    table = byte_chars()
    words = [[table[b] for b in m.group().encode()] for m in word.finditer(text)]
    merges = learn_merges(words, 400)
    specials = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("</think>", 4)]
    tokens = [t for t, _ in specials] + table + [a + b for a, b in merges]
    types = [k for _, k in specials] + [1] * (len(tokens) - len(specials))
    w = gguf.GGUFWriter(str(path), arch)
    shape_keys(w)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    write(w)


def write_spm(path: Path) -> None:
    text = TRAINING_TEXT.replace(" ", "\u2581")
    words = [list("\u2581" + line) for line in text.split("\n")]
    merges = learn_merges(words, 300)
    # Leave some characters out so that byte fallback gets exercised.
    chars = sorted({c for c in text if c not in "本界\n"})
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<sep>"]
    types = [2, 3, 3] + [6] * 256 + [4]
    scores = [0.0] * len(tokens)
    for i, (a, b) in enumerate(merges):
        if a + b not in tokens:
            tokens.append(a + b)
            types.append(1)
            scores.append(-float(i))
    for i, c in enumerate(chars):
        if c not in tokens:
            tokens.append(c)
            types.append(1)
            scores.append(-1000.0 - i)
    w = gguf.GGUFWriter(str(path), "llama")
    shape_keys(w)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    write(w)


def golden(model_path: Path, name: str) -> dict:
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    buf = (llama_cpp.ctypes.c_char * 4096)()
    pieces = []
    for tid in range(n):
        size = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, False)
        pieces.append(bytes(buf[:size]))
    cases = []
    for k, text in enumerate(CORPUS):
        last = k == len(CORPUS) - 1  # the long text once is enough
        for add_special, parse_special in ((True, True),) if last else ((True, True), (False, False), (False, True)):
            ids = llm.tokenize(text.encode(), add_bos=add_special, special=parse_special)
            decoded = b"".join(pieces[t] for t in ids)
            if ids and ids[0] == llm.token_bos() and decoded[:1] == b" ":
                decoded = decoded[1:]
            cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                          "ids": ids, "decoded_hex": decoded.hex()})
    return {
        "model": name,
        "llama_cpp_python": llama_cpp.__version__,
        "vocab_size": n,
        "bos_id": llm.token_bos(),
        "eos_id": llm.token_eos(),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [t for t in range(n) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "control_ids": [t for t in range(n) if llama_cpp.llama_vocab_is_control(vocab, t)],
        "pieces_sha256": hashlib.sha256(json.dumps([p.hex() for p in pieces]).encode()).hexdigest(),
        "cases": cases,
    }


def chat_golden(model_path: Path) -> dict:
    """SmolLM2's template rendered by llama-cpp-python's Jinja2 formatter."""
    import llama_cpp
    reader = gguf.GGUFReader(str(model_path))
    template = reader.fields["tokenizer.chat_template"].contents()
    conversations = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    ]
    renders = []
    for messages in conversations:
        for add_generation_prompt in (True, False):
            formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
                template=template, eos_token="<|im_end|>", bos_token="<|im_start|>",
                add_generation_prompt=add_generation_prompt)
            prompt = formatter(messages=messages).prompt
            renders.append({"messages": messages, "add_generation_prompt": add_generation_prompt,
                            "prompt": prompt})
    return {"llama_cpp_python": llama_cpp.__version__, "renders": renders}


def dump(data: dict) -> str:
    """One case per line: readable diffs without one line per token id."""
    head = {k: v for k, v in data.items() if k != "cases"}
    lines = [f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in head.items()]
    cases = ",\n".join(json.dumps(c, ensure_ascii=False) for c in data["cases"])
    return "{\n" + ",\n".join(lines) + ',\n"cases": [\n' + cases + "\n]}\n"


# models/templates/NAME.jinja -> bos, eos token texts of that model family
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? Ünïcödé 😀"}],
]
# date_string pins the date Llama 3.x templates would otherwise take from the clock
TEMPLATE_VARS = [{"date_string": "26 Jul 2024"}, {"date_string": "26 Jul 2024", "enable_thinking": False}]


def templates_golden(templates: Path) -> dict:
    """Real chat templates rendered by llama-cpp-python's formatter; "error" where the template
    itself refuses the conversation (gemma-2 has no system role)."""
    import llama_cpp
    renders = []
    for name, (bos, eos) in TEMPLATES.items():
        template = (templates / f"{name}.jinja").read_text()
        for messages in CONVERSATIONS:
            for add_generation_prompt in (True, False):
                for template_vars in TEMPLATE_VARS:
                    formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
                        template=template, eos_token=eos, bos_token=bos, add_generation_prompt=add_generation_prompt)
                    case = {"template": name, "bos_token": bos, "eos_token": eos, "messages": messages,
                            "add_generation_prompt": add_generation_prompt, "template_vars": template_vars}
                    try:
                        case["prompt"] = formatter(messages=messages, **template_vars).prompt
                    except ValueError as e:  # the template's raise_exception
                        case["error"] = str(e)
                    renders.append(case)
    return {"llama_cpp_python": llama_cpp.__version__, "renders": renders}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smollm2", type=Path, required=True, help="SmolLM2-135M-Instruct GGUF")
    ap.add_argument("--llama-cpp-models", type=Path, required=True,
                    help="llama.cpp's models/ folder (ggml-vocab-*.gguf, templates/)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    models = {"smollm2": args.smollm2}
    models.update({f"vocab-{name}": args.llama_cpp_models / f"ggml-vocab-{name}.gguf" for name in LLAMA_CPP_VOCABS})
    write_spm(OUT / "spm_tiny.gguf")
    models["spm_tiny"] = OUT / "spm_tiny.gguf"
    for arch, pre in (("llama", "llama-bpe"), ("qwen2", "qwen2"), ("qwen2", "deepseek-r1-qwen"), ("llama", "default")):
        path = OUT / f"bpe_{pre}_tiny.gguf"
        write_bpe(path, arch, pre)
        models[f"bpe_{pre}_tiny"] = path
    for name, path in models.items():
        data = golden(path, name)
        (OUT / f"{name}.json").write_text(dump(data))
        print(f"{name}: {len(data['cases'])} cases")
    (OUT / "smollm2_chat.json").write_text(json.dumps(chat_golden(args.smollm2), ensure_ascii=False, indent=1) + "\n")
    (OUT / "chat_templates.json").write_text(
        json.dumps(templates_golden(args.llama_cpp_models / "templates"), ensure_ascii=False, indent=1) + "\n")


if __name__ == "__main__":
    main()

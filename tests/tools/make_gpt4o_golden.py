"""Writes tests/golden/tokenizer/bpe_gpt-4o_tiny.{gguf,json}: a small byte-level BPE vocabulary
with the "gpt-4o" pre-tokenizer, tokenized by llama.cpp through xllamacpp (in the venv).

    python tests/tools/make_gpt4o_golden.py

xllamacpp wraps llama.cpp's server, not its tokenizer, so llama.cpp's C API is called through
ctypes from xllamacpp's shared library (llama_tokenize, llama_token_to_piece and the vocabulary
queries, whose signatures take no structs). A GGUF without tensors loads as a vocabulary only.
Its merges are learned from CASES too, split at whitespace only, so that the ids show where the
pre-tokenizer cuts. The cases are make_tokenizer_goldens.py's corpus plus texts that tell the gpt-4o regex's
letter-case classes and its "[\\r\\n/]*" tail apart; the JSON has the same layout as the other
goldens (decoded text as llama-cpp-python's detokenize rule, with a large buffer).
"""
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import regex
import xllamacpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.tools.make_tokenizer_goldens import CORPUS, OUT, TRAINING_TEXT, dump, write_bpe  # noqa: E402

NAME = "bpe_gpt-4o_tiny"
CASES = [
    "camelCaseWord HTTPServer XMLHttpRequest getHTTPResponseCode iPhone McDonald's",
    "ALLCAPS'S lower's Mixed'Ll ÀÉÎõü ΑΒΓαβγ ǅungla ʰmodifier ǈj Ⅻx",
    "path/to/file a/\n/b ;/\r\n// ..//\n\n x", "12345 ١٢٣٤ 1a2b3c", "e\u0301tude Cafe\u0301S \u0301x",
]
# Merges learned across letter-case and category boundaries too (words split at whitespace only),
# so that where the pre-tokenizer cuts shows in the ids: tokens never merge across its pieces.
TRAINING = TRAINING_TEXT + "\n".join(CASES) * 40
TRAINING_WORD = regex.compile(r"\S+|\s+")
VOID, CHAR, I32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32


def llama_lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(Path(xllamacpp.__file__).parent / "xllamacpp.abi3.so"))
    sigs = {"llama_model_get_vocab": (VOID, [VOID]), "llama_vocab_n_tokens": (I32, [VOID]),
            "llama_vocab_bos": (I32, [VOID]), "llama_vocab_eos": (I32, [VOID]),
            "llama_vocab_get_add_bos": (ctypes.c_bool, [VOID]),
            "llama_vocab_is_eog": (ctypes.c_bool, [VOID, I32]),
            "llama_vocab_is_control": (ctypes.c_bool, [VOID, I32]),
            "llama_tokenize": (I32, [VOID, CHAR, I32, ctypes.POINTER(I32), I32, ctypes.c_bool, ctypes.c_bool]),
            "llama_token_to_piece": (I32, [VOID, I32, CHAR, I32, I32, ctypes.c_bool])}
    for name, (res, args) in sigs.items():
        getattr(lib, name).restype, getattr(lib, name).argtypes = res, args
    return lib


class ModelParams(ctypes.Structure):
    """llama_model_params, passed on as llama_model_default_params returns it (not looked into)."""
    _fields_ = [("raw", ctypes.c_uint8 * 72)]


class Vocab:
    """llama.cpp's vocabulary of one GGUF, loaded through the C API."""

    def __init__(self, lib: ctypes.CDLL, path: Path):
        lib.llama_backend_init()
        lib.llama_model_default_params.restype = ModelParams
        lib.llama_model_load_from_file.restype = VOID
        lib.llama_model_load_from_file.argtypes = [CHAR, ModelParams]
        model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        assert model, f"llama.cpp could not load {path}"
        self.lib, self.vocab = lib, lib.llama_model_get_vocab(model)

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        out = (I32 * (len(text) + 8))()
        n = self.lib.llama_tokenize(self.vocab, text, len(text), out, len(out), add_special, parse_special)
        assert n >= 0
        return list(out[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(4096)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]


def golden(path: Path) -> dict:
    lib = llama_lib()
    v = Vocab(lib, path)
    n = lib.llama_vocab_n_tokens(v.vocab)
    bos = lib.llama_vocab_bos(v.vocab)
    pieces = [v.piece(t) for t in range(n)]
    corpus = [*CORPUS[:-1], *CASES, CORPUS[-1]]
    cases = []
    for k, text in enumerate(corpus):
        last = k == len(corpus) - 1
        for add_special, parse_special in ((True, True),) if last else ((True, True), (False, False), (False, True)):
            ids = v.tokenize(text.encode(), add_special, parse_special)
            decoded = b"".join(pieces[t] for t in ids)
            if ids and ids[0] == bos and decoded[:1] == b" ":
                decoded = decoded[1:]
            cases.append({"text": text, "add_special": add_special, "parse_special": parse_special,
                          "ids": ids, "decoded_hex": decoded.hex()})
    return {
        "model": NAME,
        "xllamacpp": xllamacpp.__version__,
        "vocab_size": n,
        "bos_id": bos,
        "eos_id": lib.llama_vocab_eos(v.vocab),
        "add_bos": bool(lib.llama_vocab_get_add_bos(v.vocab)),
        "eog_ids": [t for t in range(n) if lib.llama_vocab_is_eog(v.vocab, t)],
        "control_ids": [t for t in range(n) if lib.llama_vocab_is_control(v.vocab, t)],
        "pieces_sha256": hashlib.sha256(json.dumps([p.hex() for p in pieces]).encode()).hexdigest(),
        "cases": cases,
    }


def main() -> None:
    path = OUT / f"{NAME}.gguf"
    write_bpe(path, "gpt-oss", "gpt-4o", TRAINING, TRAINING_WORD)
    data = golden(path)
    (OUT / f"{NAME}.json").write_text(dump(data))
    print(f"{NAME}: {len(data['cases'])} cases")


if __name__ == "__main__":
    main()

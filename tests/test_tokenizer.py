"""The tokenizer against llama.cpp. The goldens (ids, decoded bytes, special tokens) come from
llama-cpp-python through tests/tools/make_tokenizer_goldens.py, for SmolLM2, for llama.cpp's own
test vocabularies (Llama 3, Qwen2, Llama 2, GPT-2, StarCoder) and for small vocabulary-only
GGUFs (SentencePiece, and byte-level BPE with other pre-tokenizers; gpt-4o's from llama.cpp through
xllamacpp, tests/tools/make_gpt4o_golden.py). llama.cpp's vocabularies
also come with texts and Hugging Face tokenizers' ids for them, a second reference."""
import hashlib
import json
from pathlib import Path

import gguf
import pytest

from vkllm.errors import VkllmError
from worker.engine.tokenizer import StreamDecoder, Tokenizer

GOLDEN = Path(__file__).parent / "golden" / "tokenizer"
LLAMA_CPP_VOCABS = sorted(p.stem.removeprefix("vocab-") for p in GOLDEN.glob("vocab-*.json"))
MODELS = ["smollm2", *(f"vocab-{v}" for v in LLAMA_CPP_VOCABS), *sorted(p.stem for p in GOLDEN.glob("*_tiny.gguf"))]


def gguf_metadata(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {key: field.contents() for key, field in reader.fields.items() if key.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def load_tokenizer(request):
    """name -> Tokenizer, each GGUF read once (reading a 128k vocabulary takes seconds)."""
    loaded = {}

    def load(name: str) -> Tokenizer:
        if name not in loaded:
            if name == "smollm2":
                path = request.getfixturevalue("smollm2_path")
            elif name.startswith("vocab-"):
                path = request.getfixturevalue("llama_cpp_models") / f"ggml-{name}.gguf"
            else:
                path = GOLDEN / f"{name}.gguf"
            loaded[name] = Tokenizer.from_metadata(gguf_metadata(path))
        return loaded[name]
    return load


@pytest.fixture(scope="module", params=MODELS)
def model(request, load_tokenizer):
    """(tokenizer, golden) for one vocabulary."""
    return load_tokenizer(request.param), json.loads((GOLDEN / f"{request.param}.json").read_text())


@pytest.mark.parametrize("vocab", LLAMA_CPP_VOCABS)
def test_llama_cpp_test_texts_match_hugging_face(vocab, load_tokenizer, llama_cpp_models):
    """llama.cpp's test-tokenizer-0 inputs: ids as Hugging Face tokenizers gives them
    (no BOS, special tokens not parsed)."""
    tok = load_tokenizer(f"vocab-{vocab}")
    texts = (llama_cpp_models / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8")
    texts = texts.split("\n__ggml_vocab_test__\n")[:-1]
    expected = (llama_cpp_models / f"ggml-vocab-{vocab}.gguf.out").read_text().split("\n")[:len(texts)]
    assert len(texts) > 30
    for text, ids in zip(texts, expected):
        assert tok.encode(text, add_special=False, parse_special=False) == [int(i) for i in ids.split()], text


def test_encode_matches_llama_cpp(model):
    tok, golden = model
    wrong = [(c["text"][:40], c["add_special"], c["parse_special"])
             for c in golden["cases"]
             if tok.encode(c["text"], add_special=c["add_special"], parse_special=c["parse_special"]) != c["ids"]]
    assert wrong == []


def test_decode_matches_llama_cpp_python(model):
    tok, golden = model
    for c in golden["cases"]:
        expected = bytes.fromhex(c["decoded_hex"])
        assert tok.decode_bytes(c["ids"]) == expected, c["text"][:40]
        assert tok.decode(c["ids"]) == expected.decode("utf-8", errors="replace")


def test_special_tokens_match_llama_cpp(model):
    tok, golden = model
    assert tok.vocab_size == golden["vocab_size"]
    assert (tok.bos_id, tok.eos_id) == (golden["bos_id"], golden["eos_id"])
    assert tok.vocab.add_bos == golden["add_bos"]
    assert sorted(tok.eog_ids) == golden["eog_ids"]
    assert [i for i, kind in enumerate(tok.vocab.types) if kind == 3] == golden["control_ids"]


def test_every_token_piece_matches_llama_cpp(model):
    tok, golden = model
    pieces = [tok.token_bytes(i).hex() for i in range(tok.vocab_size)]
    assert hashlib.sha256(json.dumps(pieces).encode()).hexdigest() == golden["pieces_sha256"]


def test_plain_text_round_trips(model):
    """Without special-token parsing every text comes back. SentencePiece needs BOS for that
    (decode drops the space prefix after it); byte-level BPE must go without, since decode
    drops a leading space after BOS there too, as llama-cpp-python does. User-defined tokens
    are parsed regardless, and SentencePiece puts a space prefix after them, so skip those."""
    tok, golden = model
    with_bos = tok.vocab.model == "llama"
    user_defined = [t for t, kind in zip(tok.vocab.tokens, tok.vocab.types) if kind == 4]
    for c in golden["cases"]:
        if not c["parse_special"] and not (with_bos and any(t in c["text"] for t in user_defined)):
            assert tok.decode(tok.encode(c["text"], add_special=with_bos, parse_special=False)) == c["text"]


def test_smollm2_chat_markup_becomes_control_tokens(smollm2_path):
    tok = Tokenizer.from_metadata(gguf_metadata(smollm2_path))
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids) == "user\nHi\n"
    assert 2 in tok.eog_ids and 0 in tok.eog_ids
    assert [tok.token_text(i) for i in ids[:3]] == ["<|im_start|>", "user", "\n"]


STREAM_TEXTS = ["😀👍🏽👨‍👩‍👧‍👦🇫🇷 ❤️", "日本語の世界と本。中文测试", "mixed: é 😀 本 ok", "rare: 𠜎𠜱 𝔘𝔫𝔦 🦩"]


def test_stream_decoder_never_splits_characters(model):
    tok, _ = model
    cut = False
    for text in STREAM_TEXTS:
        ids = tok.encode(text, add_special=True, parse_special=False)
        cut = cut or any(_is_cut(tok.token_bytes(i)) for i in ids)
        stream = StreamDecoder(tok)
        pieces = [stream.push(i) for i in ids] + [stream.flush()]
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == tok.decode(ids) == text
    assert cut, "no token ended inside a character: the texts do not exercise the decoder"


def _is_cut(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


TINY = sorted(p.stem for p in GOLDEN.glob("*_tiny.gguf"))


@pytest.mark.parametrize("name", TINY)
def test_stream_decoder_ends_with_whole_characters(name, load_tokenizer):
    """Ids that end inside a character (max_tokens reached mid-emoji) end the text before that
    character, as vLLM's and llama.cpp server's output does: no U+FFFD for the bytes that never
    got completed. A U+FFFD the text really holds (EF BF BD) stays. Reference: the text the ids
    spell, its UTF-8 cut after the prefix's bytes, with Python's decoder leaving out the cut
    character."""
    tok = load_tokenizer(name)
    ids = tok.encode("a \U0001F642\ufffd\u672c \u00e9", add_special=False, parse_special=False)
    spelled = tok.decode_bytes(ids)
    cut = 0
    for k in range(len(ids) + 1):
        stream = StreamDecoder(tok)
        text = "".join(stream.push(i) for i in ids[:k]) + stream.flush()
        expected = spelled[:len(tok.decode_bytes(ids[:k]))].decode("utf-8", errors="ignore")
        assert text == expected, k
        cut += text.encode() != tok.decode_bytes(ids[:k])
    assert cut >= 6, "too few prefixes ended inside a character to exercise the decoder"


def test_stream_decoder_keeps_bytes_no_continuation_completes_as_u_fffd(load_tokenizer):
    """ED A0 (a UTF-16 surrogate's start) is no character's beginning: Python's decoder holds it
    back all the same, and it ends the text as the U+FFFDs it would be mid-text."""
    tok = load_tokenizer("bpe_qwen2_tiny")
    ids = [next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == bytes((b,))) for b in (0x61, 0xED, 0xA0)]
    stream = StreamDecoder(tok)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == b"a\xed\xa0".decode("utf-8", errors="replace")


@pytest.mark.parametrize("change, message", [
    ({"tokenizer.ggml.model": "bert"}, "unsupported tokenizer model 'bert'"),
    ({"tokenizer.ggml.pre": "klingon"}, "unsupported pre-tokenizer 'klingon'"),
    ({"tokenizer.ggml.merges": []}, "needs tokenizer.ggml.merges"),
])
def test_bad_metadata_is_a_clear_error(change, message):
    meta = gguf_metadata(GOLDEN / "bpe_qwen2_tiny.gguf") | change
    with pytest.raises(VkllmError, match=message):
        Tokenizer.from_metadata(meta)


def test_unknown_token_id_is_a_clear_error():
    tok = Tokenizer.from_metadata(gguf_metadata(GOLDEN / "spm_tiny.gguf"))
    with pytest.raises(VkllmError, match="outside the vocabulary"):
        tok.token_bytes(tok.vocab_size)


def test_lone_surrogates_are_tokenized_as_their_bytes(model):
    """JSON can carry them; llama.cpp sees the bytes Python's surrogatepass gives."""
    tok, _ = model
    ids = tok.encode("a\ud800b", add_special=False)
    assert tok.decode_bytes(ids).lstrip(b" ") == "a\ud800b".encode("utf-8", "surrogatepass")

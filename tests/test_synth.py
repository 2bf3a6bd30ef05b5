"""Synthetic models: the real presets have the published parameter counts and llama.cpp's
Q4_K_M tensor-type counts; tiny files load in ModelFile (and in llama.cpp: see the sha256 in
tests/golden/refmodel/tiny.npz checked by test_refmodel.py); the vocabulary is consistent."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from worker.engine.modelfile import ModelFile
from worker.tools.synth import PRESETS, tensor_specs, write_model
from worker.tools.synthmix import MIXES
from worker.tools.synthvocab import CONTROL_TOKENS, build_vocab, bytes_to_unicode

# Parameter counts published with the models (without llama.cpp's rope_freqs tensor).
PUBLISHED_PARAMS = {"llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248,
                    "qwen2.5-7b": 7_615_616_512, "qwen2.5-32b": 32_763_876_352,
                    "llama-3.1-70b": 70_553_706_496,
                    # Gemma 3 report, table 1: 3,209M non-embedding + 262208 x 2560 embeddings
                    "gemma-3-4b": 3_880_263_168,
                    # Hugging Face's safetensors totals (every expert counted)
                    "qwen3-30b-a3b": 30_532_122_624, "gpt-oss-20b": 20_914_757_184,
                    "qwen1.5-moe-a2.7b": 14_315_784_192}


def type_counts(specs):
    counts = {}
    for s in specs:
        counts[s.qtype] = counts.get(s.qtype, 0) + 1
    return counts


@pytest.mark.parametrize("preset", sorted(PUBLISHED_PARAMS))
def test_real_shapes_have_published_parameter_counts(preset):
    specs = tensor_specs(PRESETS[preset], "Q4_K_M")
    n = sum(int(np.prod(s.shape)) for s in specs if s.name != "rope_freqs.weight")
    assert n == PUBLISHED_PARAMS[preset]


def test_q4_k_m_matches_llama_cpp_type_counts():
    """llama.cpp's loader prints these counts for Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf and
    qwen2.5-7b-instruct-q4_k_m.gguf."""
    assert type_counts(tensor_specs(PRESETS["llama-3.1-8b"], "Q4_K_M")) == {T.F32: 66, T.Q4_K: 193, T.Q6_K: 33}
    assert type_counts(tensor_specs(PRESETS["qwen2.5-7b"], "Q4_K_M")) == {T.F32: 141, T.Q4_K: 169, T.Q6_K: 29}


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
@pytest.mark.parametrize("mix", ["Q4_K_M", "Q5_K_M", "Q3_K_L", "Q8_0", "Q4_0"])
def test_tiny_files_load(tmp_path, preset, mix):
    path = write_model(preset, tmp_path / "m.gguf", mix)
    model = ModelFile.open(path)
    p = PRESETS[preset]
    assert model.config.n_layer == p.n_layer and model.config.vocab_size == p.n_vocab
    assert len(model.metadata["tokenizer.ggml.tokens"]) == p.n_vocab
    assert model.tensors["token_embd.weight"].shape == (p.n_embd, p.n_vocab)
    assert all(t.ggml_type == T.F32 for t in model.tensors.values() if len(t.shape) == 1)
    x = model.dequantize("blk.0.ffn_up.weight")
    assert x.shape == (p.n_ff, p.n_embd)
    assert 0.5 < x.std() * np.sqrt(p.n_embd) < 1.5          # std 1/sqrt(row length)


@pytest.mark.parametrize("preset, mix", [("tiny-qwen3moe", "Q4_K_M"), ("tiny-qwen2moe", "Q4_K_M"),
                                         ("tiny-gpt-oss", "MXFP4_MOE")])
def test_tiny_moe_files_load(tmp_path, preset, mix):
    """Expert tensors [n_expert, rows, K] as GGUF stores them (ne = K, rows, n_expert), typed by
    the mix (MXFP4_MOE: MXFP4 experts, Q8_0 else), the router F32; a shared expert's FFN as
    llama.cpp's qwen2moe loader wants it, its gate one F32 row."""
    p = PRESETS[preset]
    model = ModelFile.open(write_model(preset, tmp_path / "m.gguf", mix))
    assert (model.config.n_expert, model.config.n_expert_used, model.config.n_ff_exp) == \
        (p.n_expert, p.n_expert_used, p.n_ff_exp)
    up = model.tensors["blk.0.ffn_up_exps.weight"]
    assert up.shape == (p.n_embd, p.n_ff_exp, p.n_expert)
    assert up.ggml_type == (T.MXFP4 if mix == "MXFP4_MOE" else T.Q4_K)
    assert model.tensors["blk.0.ffn_down_exps.weight"].shape == (p.n_ff_exp, p.n_embd, p.n_expert)
    assert model.tensors["blk.0.ffn_gate_inp.weight"].ggml_type == T.F32
    x = model.dequantize("blk.1.ffn_gate_exps.weight")
    assert x.shape == (p.n_expert, p.n_ff_exp, p.n_embd) and 0.5 < x.std() * np.sqrt(p.n_embd) < 1.5
    assert model.config.n_ff_shexp == p.n_ff_shexp
    if p.n_ff_shexp:
        assert model.metadata[f"{p.arch}.expert_shared_feed_forward_length"] == p.n_ff_shexp
        assert model.tensors["blk.0.ffn_gate_inp_shexp.weight"].shape == (p.n_embd,)
        assert model.tensors["blk.0.ffn_gate_inp_shexp.weight"].ggml_type == T.F32
        assert model.tensors["blk.1.ffn_up_shexp.weight"].shape == (p.n_embd, p.n_ff_shexp)
        assert model.tensors["blk.1.ffn_down_shexp.weight"].shape == (p.n_ff_shexp, p.n_embd)


def test_tiny_llama_q4_k_m_types(tmp_path):
    """2 layers: llama.cpp's use_more_bits picks layer 1 only for attn_v and ffn_down."""
    model = ModelFile.open(write_model("tiny-llama", tmp_path / "m.gguf", "Q4_K_M"))
    types = {name: t.ggml_type for name, t in model.tensors.items()}
    assert types["blk.0.attn_v.weight"] == types["blk.0.ffn_down.weight"] == T.Q4_K
    assert types["blk.1.attn_v.weight"] == types["blk.1.ffn_down.weight"] == T.Q6_K
    assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == T.Q4_K
    assert types["rope_freqs.weight"] == T.F32


def test_narrow_rows_fall_back_like_llama_cpp(tmp_path):
    """tiny-qwen2 is 128 wide: Q4_K -> Q5_0, Q6_K -> Q8_0 (k-quants need rows of 256)."""
    model = ModelFile.open(write_model("tiny-qwen2", tmp_path / "m.gguf", "Q4_K_M"))
    assert model.tensors["blk.0.attn_q.weight"].ggml_type == T.Q5_0
    assert model.tensors["output.weight"].ggml_type == T.Q8_0


def test_same_seed_same_bytes(tmp_path):
    a = write_model("tiny-qwen3", tmp_path / "a.gguf", "Q4_K_M", seed=5).read_bytes()
    b = write_model("tiny-qwen3", tmp_path / "b.gguf", "Q4_K_M", seed=5).read_bytes()
    c = write_model("tiny-qwen3", tmp_path / "c.gguf", "Q4_K_M", seed=6).read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_every_mix_has_a_file_type():
    from worker.tools.synthmix import file_type
    assert all(file_type(mix) > 0 or mix == "F32" for mix in MIXES)


@pytest.mark.parametrize("size", [259, 400, 152064])
def test_vocab(size):
    vocab = build_vocab(size)
    assert len(vocab.tokens) == len(set(vocab.tokens)) == len(vocab.token_types) == size
    assert vocab.tokens[:256] == list(bytes_to_unicode().values())
    assert vocab.tokens[-3:] == list(CONTROL_TOKENS) and vocab.token_types[-3:] == [3, 3, 3]
    known = set(vocab.tokens)
    for merge in vocab.merges:
        a, b = merge.split(" ")
        assert a in known and b in known and a + b in known
    assert len(vocab.merges) == size - 256 - 3


def test_bytes_to_unicode_is_gpt2s():
    m = bytes_to_unicode()
    assert (m[ord("A")], m[ord(" ")], m[ord("\n")], m[0], m[255]) == ("A", "Ġ", "Ċ", "Ā", "ÿ")
    assert len(set(m.values())) == 256


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"])
def test_llama_cpp_loads_tiny_files(tmp_path, preset):
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_model(preset, tmp_path / "m.gguf", "Q4_K_M")
    llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
    tokens = llm.tokenize(b"<|im_start|>user\nhello world<|im_end|>", special=True)
    assert tokens[-1] == PRESETS[preset].n_vocab - 1          # <|im_end|> is one control token
    llm.eval(tokens)
    logits = np.array(llm.scores[:len(tokens)])
    assert np.isfinite(logits).all() and 2 < logits.std(-1).min() < 4     # output gain 3

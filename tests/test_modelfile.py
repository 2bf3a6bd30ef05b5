"""ModelFile: real files read as the gguf package reads them; each kind of bad file gives its
one-line GGUFError (and `vkllm` prints it without a traceback)."""
import re
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

from vkllm.errors import VkllmError
from worker.engine.errors import GGUFError
from worker.engine.modelfile import ModelFile
from worker.tools.synth import write_model


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_model("tiny-qwen2", tmp_path_factory.mktemp("mf") / "good.gguf", "Q8_0")


def rewrite(src, dst, arch=None, drop=(), extra_tensor=None):
    """Copy src through GGUFWriter (raw tensor bytes), optionally changing the architecture,
    dropping metadata keys or tensors, or adding a tensor (name, bytes, type)."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch or str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub)
    for t in reader.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, np.asarray(t.data).view(np.uint8),   # bytes in the tensor's shape
                              raw_dtype=t.tensor_type)
    if extra_tensor:
        name, data, qtype = extra_tensor
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def error_of(path) -> str:
    """The one-line error opening path gives, which names the file."""
    with pytest.raises(GGUFError) as info:
        ModelFile.open(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_reads_what_gguf_reads(good):
    model = ModelFile.open(good)
    reader = GGUFReader(good)
    assert model.architecture == "qwen2"
    assert model.file_size == good.stat().st_size
    assert model.metadata["qwen2.block_count"] == 2
    assert model.metadata["tokenizer.ggml.tokens"] == reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(model.tensors) == len(reader.tensors)
    for t in reader.tensors:
        ours = model.tensors[t.name]
        assert ours.shape == tuple(int(d) for d in t.shape)
        assert ours.ggml_type == t.tensor_type and ours.n_bytes == t.n_bytes == ours.data.nbytes
        assert np.shares_memory(ours.data, reader.data) or ours.data.base is not None
        assert np.array_equal(model.dequantize(t.name).reshape(-1),
                              dequantize(np.asarray(t.data), t.tensor_type).reshape(-1))
    q = model.tensors["blk.0.attn_q.weight"]
    assert q.shape == (128, 128) and q.ggml_type == T.Q8_0 and q.n_bytes == 128 * 128 // 32 * 34


def test_smollm2(smollm2_path):
    model = ModelFile.open(smollm2_path)
    embd = model.tensors["token_embd.weight"]
    assert (embd.shape, embd.ggml_type, embd.n_bytes) == ((576, 49152), T.Q8_0, 576 * 49152 // 32 * 34)
    assert model.tensors["blk.29.ffn_down.weight"].ggml_type == T.Q4_1
    assert model.n_params == 134_515_008
    assert model.metadata["tokenizer.ggml.pre"] == "smollm"
    assert len(model.metadata["tokenizer.ggml.merges"]) == 48900


def test_not_a_gguf(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello world")
    assert error_of(path) == f"{path} is not a GGUF file (starts with b'hell', expected b'GGUF')"


def test_wrong_magic(tmp_path, good):
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGML" + good.read_bytes()[4:])
    assert "is not a GGUF file (starts with b'GGML'" in error_of(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    assert "is not a GGUF file (starts with b''" in error_of(path)


def test_missing_file(tmp_path):
    assert "cannot read" in error_of(tmp_path / "nope.gguf")


def test_truncated_tensor_data(tmp_path, good):
    path = tmp_path / "cut.gguf"
    data = good.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    need = max(t.data_offset + t.n_bytes for t in GGUFReader(good).tensors)
    assert error_of(path) == f"{path}: truncated file: {len(data) * 2 // 3} bytes, but its tensor data needs {need}"


def test_truncated_header(tmp_path, good):
    path = tmp_path / "head.gguf"
    path.write_bytes(good.read_bytes()[:300])
    assert "truncated or corrupt GGUF header" in error_of(path)


def test_tensor_outside_the_file(tmp_path, good):
    path = tmp_path / "offset.gguf"
    path.write_bytes(good.read_bytes())
    reader = GGUFReader(path, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    tensor.field.parts[5][0] = 1 << 40            # the tensor's data offset
    reader.data.flush()
    del reader
    message = error_of(path)
    assert message.startswith(f"{path}: tensor 'blk.1.ffn_up.weight' data (bytes ")
    assert message.endswith(f"lies outside the file ({path.stat().st_size} bytes)")


def test_unsupported_architecture(tmp_path, good):
    path = rewrite(good, tmp_path / "falcon.gguf", arch="falcon")
    assert error_of(path) == f"{path}: unsupported architecture 'falcon' (supported: llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, gpt-oss)"


def test_unsupported_tensor_type(tmp_path, good):
    iq = np.zeros(66 * 2, np.uint8)         # two IQ2_XXS blocks: 512 values
    path = rewrite(good, tmp_path / "iq.gguf", extra_tensor=("extra.weight", iq, T.IQ2_XXS))
    message = error_of(path)
    assert message.startswith(f"{path}: tensor 'extra.weight' has unsupported type IQ2_XXS (supported: ")


def test_unknown_tensor_type_id(tmp_path, good):
    path = tmp_path / "typeid.gguf"
    path.write_bytes(good.read_bytes())
    reader = GGUFReader(path, "r+")
    reader.tensors[0].field.parts[4][0] = 99     # the tensor's ggml type id
    reader.data.flush()
    del reader
    assert error_of(path) == f"{path}: tensor 'token_embd.weight' has unknown type id 99"


def test_missing_tensor(tmp_path, good):
    path = rewrite(good, tmp_path / "missing.gguf", drop=("blk.1.attn_k.bias",))
    assert error_of(path) == f"{path}: required tensor 'blk.1.attn_k.bias' is missing (qwen2 model)"


def test_tensor_of_the_wrong_shape(tmp_path, good):
    """A q projection with half the rows its metadata says (a valid header, a wrong tensor) is
    refused with both shapes, as the file's own tensor list gives them, before anything runs."""
    q = next(t for t in GGUFReader(good).tensors if t.name == "blk.0.attn_q.weight")
    row_length, rows = (int(d) for d in q.shape)
    half = np.asarray(q.data)[:rows // 2].view(np.uint8)
    path = rewrite(good, tmp_path / "short.gguf", drop=(q.name,), extra_tensor=(q.name, half, q.tensor_type))
    assert error_of(path) == (f"{path}: tensor 'blk.0.attn_q.weight' has shape ({row_length}, {rows // 2}), "
                              f"expected ({row_length}, {rows}) (qwen2 model)")


def test_missing_metadata_key(tmp_path, good):
    path = rewrite(good, tmp_path / "nokey.gguf", drop=("qwen2.block_count",))
    assert error_of(path) == f"{path}: metadata key 'qwen2.block_count' is missing"


def test_cli_prints_one_line(tmp_path, good):
    path = tmp_path / "cut.gguf"
    path.write_bytes(good.read_bytes()[:5000])
    done = subprocess.run([sys.executable, "-c", "import sys; from vkllm.cli import main; sys.exit(main())",
                           "models", "inspect", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("vkllm: error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_broken_tokenizer_metadata_fails_the_load_naming_the_file(good, tmp_path):
    """The tokenizer is read at Engine.load, past ModelFile.open: its errors name the file too."""
    from worker.engine.engine import Engine
    broken = rewrite(good, tmp_path / "no-merges.gguf", drop={"tokenizer.ggml.merges"})
    with pytest.raises(VkllmError, match=rf"^{re.escape(str(broken))}: .*needs tokenizer.ggml.merges"):
        Engine.load(broken)

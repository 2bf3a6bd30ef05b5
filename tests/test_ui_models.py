"""The admin UI's Models page flags, from each file's header alone, a GGUF the workers cannot
serve (unsupported architecture or tensor type, truncated, not a GGUF), with the reason the
engine would give; real files written by the synthetic-model writer, the page through the app."""
import html
import os
import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from appliance import modelfiles
from tests.conftest import API_KEY
from tests.test_modelfile import rewrite
from worker.tools.synth import write_model

SUPPORTED = "llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, gpt-oss"


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    good = write_model("tiny-qwen2", folder / "good.gguf", "Q8_0")
    data = good.read_bytes()
    (folder / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
    (folder / "head.gguf").write_bytes(data[:300])
    (folder / "text.gguf").write_bytes(b"hello, not a model")
    rewrite(good, folder / "mamba.gguf", arch="mamba")
    rewrite(good, folder / "vocab.gguf", drop=[t.name for t in GGUFReader(good).tensors])
    rewrite(good, folder / "iq.gguf", extra_tensor=("extra.weight", np.zeros(66 * 2, np.uint8), T.IQ2_XXS))
    return folder


@pytest.fixture(scope="module")
def client(redis_url, models_dir):
    from appliance.app import create_app
    app = create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret",
                      "TESTING": True, "MODELS_DIR": str(models_dir)})
    client = app.test_client()
    token = re.search(r'name="csrf" value="([^"]+)"', client.get("/admin/login").get_data(as_text=True)).group(1)
    assert client.post("/admin/login", data={"api_key": API_KEY, "csrf": token}).status_code == 302
    return client


def rows(page: str) -> dict[str, list[str]]:
    """file -> the text of each cell of its row in the models table."""
    table = page.split('<table id="models">', 1)[1].split("</table>", 1)[0]
    out = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip()
                 for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells:
            out[cells[0]] = cells
    return out


def test_the_models_page_says_which_files_cannot_be_served_and_why(client, models_dir):
    page = client.get("/admin/models")
    assert page.status_code == 200
    shown = rows(page.get_data(as_text=True))
    size = (models_dir / "good.gguf").stat().st_size
    need = max(t.data_offset + t.n_bytes for t in GGUFReader(models_dir / "good.gguf").tensors)
    iq_types = "BF16, F16, F32, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0"
    assert {name: cells[-1] for name, cells in shown.items()} == {
        "good.gguf": "yes",
        "cut.gguf": f"no: truncated file: {size * 2 // 3} bytes, but its tensor data needs {need}",
        "head.gguf": "no: truncated or corrupt GGUF header: it runs past the end of the file (300 bytes)",
        "text.gguf": "no: not a GGUF file (starts with b'hell', expected b'GGUF')",
        "mamba.gguf": f"no: unsupported architecture 'mamba' (supported: {SUPPORTED})",
        "vocab.gguf": "no: required tensor 'token_embd.weight' is missing (qwen2 model)",
        "iq.gguf": f"no: tensor 'extra.weight' has unsupported type IQ2_XXS (supported: {iq_types})",
    }
    assert shown["good.gguf"][1:4] == ["qwen2", "Q8_0", f"{sum(t.n_elements for t in GGUFReader(models_dir / 'good.gguf').tensors):,}"]
    assert shown["mamba.gguf"][1] == "mamba"                    # what the header says is still shown
    assert shown["cut.gguf"][1:3] == ["qwen2", "Q8_0"]


def test_only_headers_are_read_and_each_file_once_while_it_is_unchanged(tmp_path, monkeypatch):
    """A 4 GiB file (sparse: a tiny model's bytes, then a hole) costs its header's bytes, not its
    size; listed again unchanged, nothing is read; changed, it is read again."""
    big = write_model("tiny-qwen2", tmp_path / "big.gguf", "Q8_0")
    header_end = GGUFReader(big).tensors[0].data_offset
    os.truncate(big, 4 << 30)
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data

    monkeypatch.setattr(modelfiles, "open", lambda path, mode: Counting(open(path, mode)), raising=False)
    [first] = modelfiles.scan(tmp_path)
    assert first["error"] is None and first["file_size"] == 4 << 30
    assert header_end <= sum(read) <= header_end + modelfiles.CHUNK
    read.clear()
    assert modelfiles.scan(tmp_path) == [first] and read == []
    os.truncate(big, 1000)
    [cut] = modelfiles.scan(tmp_path)
    assert cut["error"] == "truncated or corrupt GGUF header: it runs past the end of the file (1000 bytes)"


def test_a_file_whose_overrides_the_engine_refuses_is_not_servable(tmp_path):
    """The engine refuses a GGUF whose NAME.override.json is not a JSON object of allowed,
    well-typed keys (ModelFile.open); the page said such a file could be served. It now gives the
    engine's reason, and reads the overrides again once they are mended (the header is cached)."""
    from worker.engine.errors import GGUFError
    from worker.engine.modelfile import ModelFile
    good = write_model("tiny-llama", tmp_path / "good.gguf", "Q8_0")
    bad = write_model("tiny-llama", tmp_path / "bad.gguf", "Q8_0")
    (tmp_path / "good.override.json").write_text('{"general.sampling.temp": 0.3}')
    override = tmp_path / "bad.override.json"
    for text in ("{not json", '{"general.sampling.temp": "hot"}', '{"llama.block_count": 2}'):
        override.write_text(text)
        with pytest.raises(GGUFError) as refused:
            ModelFile.open(bad)
        shown = {row["file"]: row["error"] for row in modelfiles.scan(tmp_path)}
        assert shown == {"bad.gguf": str(refused.value), "good.gguf": None}
    override.write_text('{"general.sampling.top_k": 5}')
    ModelFile.open(bad)
    assert [row["error"] for row in modelfiles.scan(tmp_path)] == [None, None]
    assert ModelFile.open(good).overridden == ("general.sampling.temp",)

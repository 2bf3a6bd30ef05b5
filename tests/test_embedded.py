"""`vkllm up` as a supervisor, for real: its worker killed by pid is started again and serves;
the worker gets no API key in its environment and its /metrics listens where --host says."""
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from redis import Redis

from vkllm import protocol
from tests.conftest import API_KEY, VKLLM
from tests.test_api_cli import _children, _state, stop
from tests.test_resilience import http, submit, wait_for


@pytest.fixture
def up(tmp_path, tmp_path_factory, tiny_model):
    """`vkllm up --host 127.0.0.1` with the API key in its environment: (process, url, data folder)."""
    env = os.environ | {"VKLLM_API_KEY": API_KEY,
                        "VKLLM_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "vkcache-workers")}
    proc = subprocess.Popen([sys.executable, "-c", VKLLM, "up", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(tmp_path), "--models-dir", str(tiny_model.parent),
                             "-m", tiny_model.name],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = re.search(r"vkllm is up: (http://\S+)/", proc.stdout.readline()).group(1)
    yield proc, url, tmp_path
    stop(proc)


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")


def _child(parent: int, program: str, timeout: float = 120, other_than: int | None = None) -> int:
    """The live child of `parent` whose command line mentions `program`, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _children(parent):
            try:
                if pid != other_than and _state(pid) != "Z" and any(program in a for a in _cmdline(pid)):
                    return pid
            except OSError:
                continue
        time.sleep(0.2)
    raise AssertionError(f"no {program} child of {parent}")


def _registration(redis: Redis, pid: int, timeout: float = 120) -> dict:
    """The Redis registration of the worker process `pid`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in redis.smembers(protocol.WORKERS):
            raw = redis.hgetall(protocol.worker_key(name.decode()))
            if raw and int(raw[b"pid"]) == pid:
                return {k.decode(): v.decode() for k, v in raw.items()}
        time.sleep(0.2)
    raise AssertionError(f"worker {pid} did not register")


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) of the sockets listening on a TCP port."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


def test_up_restarts_its_dead_worker_and_redis_and_keeps_the_key_and_metrics_to_itself(up):
    proc, url, _ = up
    redis_pid = _child(proc.pid, "redis-server")
    port = int(re.search(r"127\.0\.0\.1:(\d+)", " ".join(_cmdline(redis_pid))).group(1))   # redis-server's title
    redis = Redis(port=port)
    first = _child(proc.pid, "vkllm.cli")
    with open(f"/proc/{first}/environ", "rb") as f:
        env = dict(e.split("=", 1) for e in f.read().decode().split("\0") if "=" in e)
    assert "VKLLM_API_KEY" not in env and API_KEY not in "".join(env.values())
    metrics_port = int(_registration(redis, first)["metrics_port"])
    assert _listening(metrics_port) == ["0100007F"]   # 127.0.0.1, as --host said; not 0.0.0.0

    os.kill(first, signal.SIGKILL)
    second = _child(proc.pid, "vkllm.cli", other_than=first)
    _registration(redis, second)
    job = wait_for(url, submit(url, max_tokens=4), timeout=120)
    assert job["state"] == "finished" and job["usage"]["completion_tokens"] == 4
    assert http(f"{url}/readyz")[0] == 200

    # its redis-server killed too: started again on the same port and data, and the worker rides it out
    os.kill(redis_pid, signal.SIGKILL)
    _child(proc.pid, "redis-server", other_than=redis_pid)
    deadline = time.monotonic() + 60
    while http(f"{url}/readyz")[0] != 200:   # 503 until Redis answers and the worker has published again
        assert time.monotonic() < deadline
        time.sleep(0.2)
    job = wait_for(url, submit(url, max_tokens=3), timeout=120)
    assert job["state"] == "finished" and job["usage"]["completion_tokens"] == 3
    assert _child(proc.pid, "vkllm.cli") == second   # the same worker process


@pytest.mark.parametrize("flags, reason", (
    (["-m", "nosuch.gguf"], "model 'nosuch.gguf' not found (as a path or in {models})"),
    (["--split", "1,2"], "a split of 2 shares needs as many devices, not 1"),
))
def test_up_whose_worker_cannot_start_says_why_and_exits(tmp_path, tiny_model, flags, reason):
    """A worker whose first run ends with vkllm's usage status (a model not found, a split the
    devices cannot take) fails the same way every time: `up` restarted it forever, the reason
    only in worker.log. It now stops everything and exits 2 with the worker's line."""
    proc = subprocess.Popen([sys.executable, "-c", VKLLM, "up", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(tmp_path), "--models-dir", str(tiny_model.parent),
                             "-m", tiny_model.name, *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        stop(proc)
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "vkllm: error: the worker cannot start: " + reason.format(models=tiny_model.parent)
    assert "starting it again" not in err
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _mentions(int(pid), str(tmp_path))]


def _mentions(pid: int, text: str) -> bool:
    """Whether the live process pid has text in its command line (redis-server: its --dir)."""
    try:
        return _state(pid) != "Z" and any(text in a for a in _cmdline(pid))
    except OSError:
        return False


def test_a_second_up_on_its_data_dir_is_refused_and_a_killed_up_leaves_no_children(up):
    """Two `up`s on one data folder ran two redis-servers over one append-only file and two
    workers (the model twice in memory); an `up` killed outright (OOM killer, kill -9) left its
    redis-server and worker running for ever, and the next `up` started a second pair. A second
    `up` is now refused naming the first, and a killed one's children end with it."""
    proc, url, data = up
    redis_pid, worker_pid = _child(proc.pid, "redis-server"), _child(proc.pid, "vkllm.cli")
    second = subprocess.run([sys.executable, "-c", VKLLM, "up", "--host", "127.0.0.1", "--port", "0",
                             "--data-dir", str(data), "-m", "nosuch.gguf"],
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stderr
    assert second.stderr.splitlines()[-1] == \
        f"vkllm: error: {data} is in use by another vkllm up (pid {proc.pid}); give each its own --data-dir"
    assert (data / "redis.log").read_text().count("Ready to accept connections") == 1   # it started nothing

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while _mentions(redis_pid, "redis-server") or _mentions(worker_pid, "vkllm.cli"):
        assert time.monotonic() < deadline, "the killed up's redis-server or worker is still running"
        time.sleep(0.2)

"""`vkllm up`: the whole appliance on one machine without docker. A private redis-server (on
localhost, its own port and data folder), one worker and the web app; Ctrl-C stops all three.

This process supervises the other two: a worker or a redis-server that exits is started again
(the same port and data for Redis), after a pause that grows while they keep dying young. A
first run that dies young with vkllm's usage status (a model not found, a split the devices
cannot take) would fail alike every time: `up` stops, with the child's own error line.

The children run in their own sessions so that Ctrl-C reaches only this process, which then
stops them in order: the web server, the worker (its current job ends failed, partial text
kept), then Redis (which syncs its append-only file). Killed outright, this process takes them
with it (Redis stopped, the worker killed: the next `up` fails its jobs, partial text kept, as a
killed worker's), and one data folder takes one `up` at a time."""
import ctypes
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from redis import Redis
from werkzeug.serving import LISTEN_QUEUE, get_sockaddr, make_server, select_address_family

from appliance import auth
from vkllm.config import worker_environment
from vkllm.errors import VkllmError
from vkllm.outage import CLIENT_OPTIONS, RefusesWrites

USAGE_STATUS = 2      # what `vkllm` exits with for an error of the user's (vkllm.cli.main, argparse)
YOUNG = 60.0          # seconds: a child that exits sooner after its start is dying young
ERROR_PREFIX = re.compile(r"vkllm( [\w-]+)?: error: ")   # how the CLI and argparse start that line
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that started it ends
_prctl = ctypes.CDLL(None, use_errno=True).prctl   # bound here: a child between fork and exec only calls it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listen(host: str, port: int) -> socket.socket:
    """The web app's socket, bound before anything starts: a port in use (or an address not of
    this machine) is one error line, before a first run generates a key it would never show."""
    family = select_address_family(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as werkzeug's server does
    try:
        sock.bind(get_sockaddr(host, port, family))
        sock.listen(LISTEN_QUEUE)
    except OSError as e:
        sock.close()
        raise VkllmError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    return sock


def _lock(data_dir: Path):
    """The data folder's lock, held while this process lives (the kernel drops it however it
    ends): a second `up` would run a second redis-server over the same append-only file."""
    lock = open(data_dir / "up.pid", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise VkllmError(f"{data_dir} is in use by another vkllm up (pid {holder}); give each its own --data-dir") \
            from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    return lock


def _ending_with_us(sig: int):
    """A child's preexec_fn: the child gets `sig` when this process ends, even killed outright
    (in its own session it would outlive us, holding its port, the data folder and its memory)."""
    parent = os.getpid()

    def arm():
        _prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:   # we ended before it was armed
            os.kill(os.getpid(), sig)
    return arm


def _start_redis(data_dir: Path, port: int) -> subprocess.Popen:
    folder = data_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "redis.log", "ab")
    # bounded, and refusing writes when full (the API answers 503) rather than evicting queued jobs
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                             "--appendonly", "yes", "--save", "", "--maxmemory", "1gb",
                             "--maxmemory-policy", "noeviction"], stdout=log, stderr=log, start_new_session=True,
                            preexec_fn=_ending_with_us(signal.SIGTERM))
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            Redis.from_url(url).ping()
            return proc
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    proc.kill()
    raise VkllmError(f"redis-server did not start; see {data_dir / 'redis.log'}")


def _stop(proc: subprocess.Popen, signals=(signal.SIGTERM, signal.SIGTERM), wait: float = 10) -> None:
    """Send each signal in turn until the process ends (RQ: first warm, second cold shutdown)."""
    for sig in signals:
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


class _Supervised:
    """A child process started again whenever it exits: after 1 s, doubling up to a minute while
    it keeps exiting within a minute of its start."""

    def __init__(self, name: str, start, log_path: Path):
        self.name, self._start, self.log_path = name, start, log_path
        self.proc = start()
        self.started, self.pause, self.restart_at, self.first = time.monotonic(), 1.0, None, True

    def check(self) -> None:
        """Called every half second or so: notice an exit, restart when its pause is over;
        VkllmError with the child's error line when its first run died young with the usage status."""
        now = time.monotonic()
        if self.restart_at is None:
            code = self.proc.poll()
            if code == USAGE_STATUS and self.first and now - self.started < YOUNG:
                raise VkllmError(f"the {self.name} cannot start: {self._error_line()}")
            if code is not None:
                self._again(now, f"exited (status {code})")
        elif now >= self.restart_at:
            self.restart_at, self.started, self.first = None, now, False
            try:
                self.proc = self._start()
            except VkllmError as e:
                self._again(now, f"did not start ({e})")

    def _error_line(self) -> str:
        """The last line of the log, where the child printed its one-line error."""
        with open(self.log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines() or [f"see {self.log_path}"]
        return ERROR_PREFIX.sub("", lines[-1], count=1)

    def _again(self, now: float, what: str) -> None:
        self.pause = 1.0 if now - self.started > YOUNG else min(self.pause * 2, 60.0)
        self.restart_at = now + self.pause
        print(f"vkllm: the {self.name} {what}; starting it again in {self.pause:.0f} s (see {self.log_path})",
              file=sys.stderr, flush=True)


def worker_command(args, redis_url: str, models: list[str]) -> list[str]:
    """The `vkllm worker` that `up` supervises, with its --devices, --split and
    --gpu-memory-utilization as typed."""
    return [sys.executable, "-m", "vkllm.cli", "worker", "--redis-url", redis_url, "--metrics-port", "0",
            "--metrics-host", args.host, *[a for m in models for a in ("-m", m)],
            *[a for name in ("devices", "split", "gpu_memory_utilization") if getattr(args, name)
              for a in (f"--{name.replace('_', '-')}", getattr(args, name))]]


def run(args, api_key: str | None) -> int:
    from appliance.app import create_app

    listener = _listen(args.host, args.port)
    data_dir = Path(args.data_dir or Path.home() / ".local" / "share" / "vkllm")
    models_dir = Path(args.models_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(data_dir)
    models = args.model
    if not models:
        from vkllm.demo import (
            fetch_demo,  # standard library only: downloads, never loads
        )
        print(f"vkllm: fetching the demo model into {models_dir} ...", file=sys.stderr, flush=True)
        models = [fetch_demo(models_dir).name]

    signal.signal(signal.SIGTERM, _interrupt)   # a service manager's stop is a Ctrl-C too
    port = _free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    redis = _Supervised("redis-server", lambda: _start_redis(data_dir, port), data_dir / "redis.log")
    worker = server = None
    try:
        try:
            generated = auth.ensure_key(Redis.from_url(redis_url, **CLIENT_OPTIONS), api_key)
        except RefusesWrites as e:   # its append-only file cannot be written: a full or failing disk
            raise VkllmError(f"the appliance's Redis refuses writes ({e}); its data is in {data_dir / 'redis'}, "
                             f"its log {data_dir / 'redis.log'}") from None
        app = create_app({"REDIS_URL": redis_url, "API_KEY": api_key, "MODELS_DIR": str(models_dir),
                          "DATA_DIR": str(data_dir)})
        server = make_server(args.host, args.port, app, threaded=True, fd=listener.fileno())
        listener.close()   # the server holds a duplicate
        env = worker_environment(str(models_dir))
        worker_log = open(data_dir / "worker.log", "ab")
        command = worker_command(args, redis_url, models)
        worker = _Supervised("worker", lambda: subprocess.Popen(
            command, stdout=worker_log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_ending_with_us(signal.SIGKILL)),
            data_dir / "worker.log")
        threading.Thread(target=server.serve_forever, name="vkllm-web", daemon=True).start()
        host = f"[{args.host}]" if ":" in args.host else args.host   # an IPv6 address, as URLs write it
        print(f"vkllm is up: http://{host}:{server.port}/  (admin UI at /admin/)", flush=True)
        if generated:
            print(f"API key (shown only now; `vkllm apikey rotate` makes a new one): {generated}", flush=True)
        elif not api_key:
            print("API key: the one printed on the first run (`vkllm apikey rotate` makes a new one)", flush=True)
        print(f"worker log: {data_dir / 'worker.log'}; Ctrl-C stops everything", flush=True)
        while True:
            time.sleep(0.5)
            redis.check()
            worker.check()
    except KeyboardInterrupt:
        print("vkllm: stopping", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        if worker is not None:
            _stop(worker.proc)
        _stop(redis.proc)
        lock.close()   # once its redis-server has ended
    return 0

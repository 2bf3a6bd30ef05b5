"""`vkllm up`: the whole appliance on one machine without docker. A private redis-server (on
localhost, its own port and data folder), one worker and the web app; Ctrl-C stops all three.

The children run in their own sessions so that Ctrl-C reaches only this process, which then
stops them in order: the web server, the worker (its current job ends failed, partial text
kept), then Redis (which syncs its append-only file)."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from redis import Redis
from werkzeug.serving import make_server

from appliance import auth
from vkllm.errors import VkllmError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_redis(data_dir: Path) -> tuple[subprocess.Popen, str]:
    folder = data_dir / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = open(data_dir / "redis.log", "ab")
    # bounded, and refusing writes when full (the API answers 503) rather than evicting queued jobs
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                             "--appendonly", "yes", "--save", "", "--maxmemory", "1gb",
                             "--maxmemory-policy", "noeviction"], stdout=log, stderr=log, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            Redis.from_url(url).ping()
            return proc, url
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


def run(args, api_key: str | None) -> int:
    from appliance.app import create_app

    data_dir = Path(args.data_dir or Path.home() / ".local" / "share" / "vkllm")
    models_dir = Path(args.models_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    models = args.model
    if not models:
        from vkllm.demo import (
            fetch_demo,  # standard library only: downloads, never loads
        )
        print(f"vkllm: fetching the demo model into {models_dir} ...", file=sys.stderr, flush=True)
        models = [fetch_demo(models_dir).name]

    signal.signal(signal.SIGTERM, _interrupt)   # a service manager's stop is a Ctrl-C too
    redis_proc, redis_url = _start_redis(data_dir)
    worker_proc = server = None
    try:
        generated = auth.ensure_key(Redis.from_url(redis_url), api_key)
        app = create_app({"REDIS_URL": redis_url, "API_KEY": api_key, "MODELS_DIR": str(models_dir)})
        server = make_server(args.host, args.port, app, threaded=True)
        env = os.environ | {"VKLLM_MODELS_DIR": str(models_dir)}
        worker_log = open(data_dir / "worker.log", "ab")
        worker_proc = subprocess.Popen(
            [sys.executable, "-m", "vkllm.cli", "worker", "--redis-url", redis_url, "--metrics-port", "0",
             *[a for m in models for a in ("-m", m)]],
            stdout=worker_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        print(f"vkllm is up: http://{args.host}:{server.server_port}/  (admin UI at /admin/)", flush=True)
        if generated:
            print(f"API key (shown only now; `vkllm apikey rotate` makes a new one): {generated}", flush=True)
        elif not api_key:
            print("API key: the one printed on the first run (`vkllm apikey rotate` makes a new one)", flush=True)
        print(f"worker log: {data_dir / 'worker.log'}; Ctrl-C stops everything", flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        print("vkllm: stopping", file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.server_close()
        if worker_proc is not None:
            _stop(worker_proc)
        _stop(redis_proc)
    return 0

"""What the `vkllm` commands take from the environment (VKLLM_*), read once when the CLI
builds its parser and handed down as argument defaults; what gunicorn and the web app's metrics
take from it (`WebServer`); and the environment `vkllm up` hands its worker (`worker_environment`).
The web app reads its own VKLLM_* settings in create_app (Flask's from_prefixed_env)."""
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandDefaults:
    redis_url: str = "redis://localhost:6379/0"
    metrics_port: int = 9400
    url: str = "http://localhost:8000"        # where `submit`, `jobs`, `follow` find the web app
    api_key: str | None = None
    models_dir: str = "models"
    # where a worker's /metrics listens: every interface, for a Prometheus on another host or
    # container (`vkllm up` passes its own --host instead)
    metrics_host: str = "0.0.0.0"

    @classmethod
    def from_env(cls, env=None) -> "CommandDefaults":
        env = os.environ if env is None else env
        base = cls()
        return cls(redis_url=env.get("VKLLM_REDIS_URL", base.redis_url),
                   metrics_port=int(env.get("VKLLM_METRICS_PORT", base.metrics_port)),
                   metrics_host=env.get("VKLLM_METRICS_HOST") or base.metrics_host,
                   url=env.get("VKLLM_URL", base.url),
                   api_key=env.get("VKLLM_API_KEY") or None,
                   models_dir=env.get("VKLLM_MODELS_DIR") or base.models_dir)


@dataclass(frozen=True)
class WebServer:
    """gunicorn's processes and threads (appliance/gunicorn_conf.py), and the folder where
    prometheus_client keeps its multiprocess series (PROMETHEUS_MULTIPROC_DIR, which that library
    reads by itself; with it set, /metrics must merge the processes' files)."""
    processes: int = 2
    threads: int = 32   # each open SSE stream holds a thread
    metrics_dir: str | None = None

    @classmethod
    def from_env(cls, env=None) -> "WebServer":
        env = os.environ if env is None else env
        base = cls()
        return cls(processes=int(env.get("VKLLM_WEB_PROCESSES", base.processes)),
                   threads=int(env.get("VKLLM_WEB_THREADS", base.threads)),
                   metrics_dir=env.get("PROMETHEUS_MULTIPROC_DIR") or None)


# environment the worker must not inherit: it needs no API key, and a secret is safest unseen
WEB_ONLY = ("VKLLM_API_KEY", "VKLLM_SECRET_KEY")


def worker_environment(models_dir: str, env=None) -> dict[str, str]:
    """This process's environment for a worker it starts, less WEB_ONLY, with its models folder."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in WEB_ONLY} | {"VKLLM_MODELS_DIR": models_dir}

"""What the `vkllm` commands take from the environment (VKLLM_*), read once when the CLI
builds its parser and handed down as argument defaults. The web app reads its own settings in
create_app (Flask's from_prefixed_env); gunicorn's in gunicorn_conf.py."""
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

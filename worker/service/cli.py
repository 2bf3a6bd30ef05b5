"""`vkllm worker`: serve generation jobs for one or more models on this GPU.

Imports stay inside the command function: `vkllm --help` loads neither RQ nor the engine."""
from vkllm.argtypes import count, port, redis_url, seconds
from vkllm.config import CommandDefaults
from worker.tools.devices import add_device_arguments


def register(sub) -> None:
    env = CommandDefaults.from_env()

    p = sub.add_parser("worker", help="serve generation jobs for one or more models on this GPU")
    p.add_argument("-m", "--model", action="append", required=True,
                   help="GGUF file, or its name in the models folder (repeatable)")
    p.add_argument("--redis-url", type=redis_url, default=env.redis_url)
    p.add_argument("-c", "--n-ctx", type=count, default=None, help="context length (default: the engine's)")
    p.add_argument("--name", help="worker name (default: host-pid)")
    p.add_argument("--metrics-port", type=port, default=env.metrics_port,
                   help="Prometheus /metrics port (0: any free one)")
    p.add_argument("--metrics-host", default=env.metrics_host,
                   help="address /metrics listens on (default: VKLLM_METRICS_HOST or 0.0.0.0)")
    p.add_argument("--heartbeat-interval", type=seconds, default=5.0, help="seconds between heartbeats")
    p.add_argument("--burst", action="store_true", help="quit when the queues are empty")
    add_device_arguments(p)
    p.set_defaults(func=_worker)


def _worker(args):
    from worker.service.serve import serve
    from worker.tools.devices import settings
    return serve(args, settings(args))

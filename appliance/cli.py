"""The appliance's commands: `up`, `submit`, `jobs`, `follow`, `apikey rotate`.

Imports stay inside the command functions: `vkllm --help` loads neither Flask nor Redis."""
from vkllm.argtypes import port, redis_url
from vkllm.config import CommandDefaults
from vkllm.sampling_defaults import SERVER as SAMPLING_DEFAULTS
from vkllm.sampling_defaults import describe


def register(sub) -> None:
    env = CommandDefaults.from_env()

    p = sub.add_parser("up", help="run redis, a worker with the demo model and the web app on this machine")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--data-dir", default=None, help="redis data and logs (default: ~/.local/share/vkllm)")
    p.add_argument("--models-dir", default=env.models_dir, help="GGUF folder (default: VKLLM_MODELS_DIR or ./models)")
    p.add_argument("-m", "--model", action="append", help="model(s) to serve (default: the demo model)")
    p.add_argument("--devices", help="the worker's Vulkan devices, its models' layers split across them (0,1)")
    p.add_argument("--split", help="each device's share of the layers (40,60; default: by free memory)")
    p.add_argument("--gpu-memory-utilization", metavar="SHARE",
                   help="share of each device's memory the worker may have in use, 0 to 1 (default: 1)")
    p.set_defaults(func=_up, api_key=env.api_key)

    for name, text in (("submit", "submit a job over the REST API"), ("jobs", "list jobs"),
                       ("follow", "stream a job's text as it is generated")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--url", default=env.url)
        p.add_argument("--api-key", default=env.api_key)
        if name == "submit":
            p.add_argument("prompt")
            p.add_argument("-m", "--model", required=True)
            p.add_argument("-n", "--max-tokens", type=int, default=None)
            # left out: the model's default, which the API applies
            for param, default in SAMPLING_DEFAULTS.items():
                p.add_argument("--" + param.replace("_", "-"), type=type(default), default=None,
                               help=describe(param))
            p.add_argument("--seed", type=int, default=None)
            p.add_argument("--chat", action="store_true", help="send the prompt as a user message")
            p.add_argument("--priority", choices=("normal", "high"), default="normal")
            p.add_argument("--follow", action="store_true", help="then stream the text")
        elif name == "jobs":
            p.add_argument("--state", choices=("queued", "running", "finished", "failed", "cancelled"))
            p.add_argument("--limit", type=int, default=20)
        else:
            p.add_argument("job_id")
        p.set_defaults(func=_client_command)

    p = sub.add_parser("apikey", help="manage the API key")
    p.add_argument("action", choices=("rotate",))
    p.add_argument("--redis-url", type=redis_url, default=env.redis_url)
    p.set_defaults(func=_apikey, key_in_env=env.api_key is not None)


def _up(args):
    from appliance.embedded import run
    return run(args, args.api_key)


def _client_command(args):
    from appliance.client import run
    return run(args)


def _apikey(args):
    from redis import Redis

    from appliance.auth import rotate
    from vkllm.errors import VkllmError
    from vkllm.outage import CLIENT_OPTIONS, UNAVAILABLE, RefusesWrites
    try:
        key = rotate(Redis.from_url(args.redis_url, **CLIENT_OPTIONS))
    except RefusesWrites as e:
        raise VkllmError(f"Redis at {args.redis_url} refuses writes: {e}") from None
    except UNAVAILABLE as e:
        raise VkllmError(f"cannot reach Redis at {args.redis_url}: {e}") from None
    print(f"new API key (shown only now): {key}")
    if args.key_in_env:
        print("note: VKLLM_API_KEY is set in this environment and wins over the stored key")
    return 0

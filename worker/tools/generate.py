"""`vkllm generate`: stream a completion to stdout, timings to stderr."""
import sys

from vkllm.argtypes import count
from vkllm.errors import VkllmError
from vkllm.sampling_defaults import SERVER, describe
from worker.tools.devices import add_device_arguments, settings


def register(sub):
    p = sub.add_parser("generate", help="generate text from a GGUF model")
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("-n", "--max-tokens", type=count, default=128)
    p.add_argument("-c", "--ctx-size", type=count, default=None, help="context length (default: 4096 or the model's)")
    for name, default in SERVER.items():   # left out: the model's default (Engine.sampling_defaults)
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=None, help=describe(name))
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_device_arguments(p)
    p.set_defaults(func=run)


def run(args):
    if args.system is not None and not args.chat:
        raise VkllmError("--system is the system message of a chat: it needs --chat")
    from vkllm.sampling_defaults import fill
    from worker.engine.engine import Engine
    from worker.engine.sampling import SamplingParams
    chosen = {name: getattr(args, name) for name in SERVER}

    def params(model_defaults: dict | None) -> SamplingParams:
        return SamplingParams(**fill(chosen, model_defaults), seed=args.seed, max_tokens=args.max_tokens,
                              stop=tuple(args.stop))

    params(None)   # what the user gave is refused before the model (slow to load) is read
    engine = Engine.load(args.model, settings(args), n_ctx=args.ctx_size, progress=sys.stderr.isatty())
    try:
        sampling = params(engine.sampling_defaults)
        prompt = args.prompt
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            prompt = engine.render_chat(messages + [{"role": "user", "content": args.prompt}])
        for event in engine.generate(prompt, sampling):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        t = event.timings
        print(f"\n\nprompt: {t.prompt_tokens} tokens, {t.prompt_tokens_per_second:.1f} tok/s; "
              f"generation: {t.generated_tokens} tokens, {t.generation_tokens_per_second:.1f} tok/s; "
              f"finish: {event.finish_reason}", file=sys.stderr)
    finally:
        engine.close()

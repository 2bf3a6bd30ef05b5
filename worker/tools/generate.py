"""`vkllm generate`: stream a completion to stdout, timings to stderr."""
import sys

from worker.engine.config import Settings


def register(sub):
    p = sub.add_parser("generate", help="generate text from a GGUF model")
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("-n", "--max-tokens", type=int, default=128)
    p.add_argument("-c", "--ctx-size", type=int, default=None, help="context length (default: 4096 or the model's)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.set_defaults(func=run)


def run(args):
    from worker.engine.engine import Engine
    from worker.engine.sampling import SamplingParams
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repeat_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, seed=args.seed,
                            max_tokens=args.max_tokens, stop=tuple(args.stop))
    engine = Engine.load(args.model, Settings.from_env(), n_ctx=args.ctx_size, progress=sys.stderr.isatty())
    try:
        prompt = args.prompt
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            prompt = engine.render_chat(messages + [{"role": "user", "content": args.prompt}])
        for event in engine.generate(prompt, params):
            sys.stdout.write(event.text)
            sys.stdout.flush()
        t = event.timings
        print(f"\n\nprompt: {t.prompt_tokens} tokens, {t.prompt_tokens_per_second:.1f} tok/s; "
              f"generation: {t.generated_tokens} tokens, {t.generation_tokens_per_second:.1f} tok/s; "
              f"finish: {event.finish_reason}", file=sys.stderr)
    finally:
        engine.close()

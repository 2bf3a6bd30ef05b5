"""`vkllm bench -m FILE`: prompt processing (pp) and generation (tg) speed, as llama-bench
reports them, against a measured read-bandwidth roofline and, with --peer llama.cpp, against
llama.cpp's Vulkan backend timed in the same run. `vkllm bench kernels`: per-kernel figures."""
import statistics
import time

import numpy as np

from worker.engine.config import Settings


def register(sub):
    p = sub.add_parser("bench", help="benchmark a model (pp/tg tokens/s) or the kernels")
    p.add_argument("-m", "--model", help="GGUF file")
    p.add_argument("-p", "--n-prompt", type=int, default=512)
    p.add_argument("-n", "--n-gen", type=int, default=128)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--peer", choices=["llama.cpp"], help="also time llama.cpp's Vulkan backend (cyllama)")
    p.add_argument("--profile", action="store_true",
                   help="also print GPU time per kernel of one decode step and one prefill chunk")
    p.set_defaults(func=run)
    kinds = p.add_subparsers(dest="bench_command")
    from worker.tools import bench_kernels
    kernels = kinds.add_parser("kernels", help="mat-vec GB/s per quant type at LLM shapes")
    bench_kernels.add_arguments(kernels)
    kernels.set_defaults(func=bench_kernels.run)


def weight_bytes_per_token(model_file) -> int:
    """Every weight is read once per token, except the embedding table, of which one row is."""
    total = sum(t.n_bytes for t in model_file.tensors.values())
    embd = model_file.tensors["token_embd.weight"]
    return total - (embd.n_bytes if "output.weight" in model_file.tensors else 0)


def time_engine(engine, n_prompt: int, n_gen: int, reps: int) -> dict:
    runner, vocab = engine.runner, engine.config.vocab_size
    tokens = np.random.default_rng(0).integers(0, vocab, n_prompt).tolist()
    pp, tg, host = [], [], []
    for rep in range(reps + 1):  # the first of each is a warm-up
        start = time.perf_counter()
        runner.prefill(tokens, 0, engine.chunk)
        pp.append(n_prompt / (time.perf_counter() - start))
        token, gpu, start = tokens[0], 0.0, time.perf_counter()
        for pos in range(n_gen):
            runner.decode(token, pos)
            token = runner.read_argmax()
            gpu += runner.last_gpu_seconds()
        wall = time.perf_counter() - start
        tg.append(n_gen / wall)
        host.append((wall - gpu) / n_gen)
    return {"pp": statistics.median(pp[1:]), "tg": statistics.median(tg[1:]), "host": statistics.median(host[1:])}


def run(args):
    from vkllm.errors import VkllmError
    from worker.engine.engine import Engine
    if not args.model:
        raise VkllmError("bench needs -m FILE (or the 'kernels' subcommand)")
    engine = Engine.load(args.model, Settings.from_env(), n_ctx=args.n_prompt + args.n_gen + 16,
                         max_batch=min(512, args.n_prompt))
    try:
        from worker.engine.modelfile import ModelFile
        from worker.tools.roofline import read_bandwidth
        model_file = ModelFile.open(args.model)
        per_token = weight_bytes_per_token(model_file)
        _, total = engine.ctx.memory_budget()
        roofline = read_bandwidth(engine.ctx, min(1 << 30, total // 8))
        ours = time_engine(engine, args.n_prompt, args.n_gen, args.repetitions)
        if args.profile:
            print_profile(engine, args.n_prompt)
    finally:
        engine.close()
    print(f"model {args.model}: {per_token / 1e9:.3f} GB of weights read per token; "
          f"measured read roofline {roofline / 1e12:.3f} TB/s -> at most {roofline / per_token:.0f} tok/s")
    print(f"{'engine':18} {'pp' + str(args.n_prompt):>10} {'tg' + str(args.n_gen):>9} {'ms/tok':>7} "
          f"{'host us/tok':>11} {'% roofline':>10}")
    _print_row("vkllm", ours, per_token, roofline)
    if args.peer:
        from worker.tools.bench_peer import time_llama_cpp
        peer = time_llama_cpp(args.model, engine.config.vocab_size, args.n_prompt, args.n_gen, args.repetitions)
        _print_row("llama.cpp-vulkan", peer, per_token, roofline)
        print(f"vkllm / llama.cpp: pp {ours['pp'] / peer['pp']:.2f}x, tg {ours['tg'] / peer['tg']:.2f}x")


def print_profile(engine, n_prompt: int):
    """Per-kernel GPU time (timestamps after every dispatch) of a decode step at position
    n_prompt and of a prefill chunk; each dispatch's time includes the barrier before it."""
    chunk = min(engine.chunk, n_prompt)
    for title, n, pos in (("decode step", 1, n_prompt), (f"prefill chunk of {chunk}", chunk, 0)):
        table = engine.runner.profile(n, pos)
        total = sum(ns for _, ns in table.values())
        print(f"{title}: {total / 1e6:.3f} ms GPU in {sum(c for c, _ in table.values())} dispatches")
        for name, (count, ns) in sorted(table.items(), key=lambda item: -item[1][1]):
            print(f"  {name:28} {count:5d} x {ns / count / 1e3:8.1f} us = {ns / 1e6:8.3f} ms "
                  f"({100 * ns / total:4.1f}%)")


def _print_row(name, r, per_token, roofline):
    host_us = f"{r['host'] * 1e6:.0f}" if r.get("host") is not None else "-"
    print(f"{name:18} {r['pp']:10.1f} {r['tg']:9.1f} {1e3 / r['tg']:7.2f} {host_us:>11} "
          f"{100 * r['tg'] * per_token / roofline:9.1f}%", flush=True)

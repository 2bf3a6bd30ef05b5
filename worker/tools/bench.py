"""`vkllm bench -m FILE`: prompt processing (pp) and generation (tg) speed, as llama-bench
reports them, against a measured read-bandwidth roofline and, with --peer llama.cpp, against
llama.cpp's Vulkan backend timed in the same run. `vkllm bench kernels`: per-kernel figures; `vkllm bench serve`: serving under concurrent load
(worker/tools/bench_serve.py)."""
import statistics
import time

import numpy as np

from vkllm.argtypes import count, counts
from worker.tools.devices import add_device_arguments, settings


def register(sub):
    p = sub.add_parser("bench", help="benchmark a model (pp/tg tokens/s) or the kernels")
    p.add_argument("-m", "--model", action="append", help="GGUF file (repeatable: one table for all)")
    p.add_argument("-p", "--n-prompt", type=count, default=512)
    p.add_argument("-n", "--n-gen", type=count, default=128)
    p.add_argument("-r", "--repetitions", type=count, default=3)
    p.add_argument("-c", "--ctx", type=count,
                   help="positions the engines' KV caches hold (default: prompt + generated + 16, as llama-bench; "
                        "a worker's default is 4096, and decode attention's split count follows it)")
    p.add_argument("--peer", choices=["llama.cpp"], help="also time llama.cpp's Vulkan backend (cyllama)")
    p.add_argument("--profile", action="store_true",
                   help="also print GPU time per kernel of one decode step and one prefill chunk "
                        "(with --batch: of one decode step of N sequences each)")
    p.add_argument("--batch", type=counts, metavar="N,N,...",
                   help="instead: aggregate decode tokens/s of N sequences decoded together "
                        "(prompts of -p tokens, -n tokens each)")
    add_device_arguments(p)
    p.set_defaults(func=run)
    kinds = p.add_subparsers(dest="bench_command")
    from worker.tools import bench_kernels
    kernels = kinds.add_parser("kernels", help="mat-vec GB/s per quant type at LLM shapes")
    bench_kernels.add_arguments(kernels)
    kernels.set_defaults(func=bench_kernels.run)
    from worker.tools import bench_serve
    serve = kinds.add_parser("serve", help="N concurrent jobs through the API or the engine's batch: "
                                           "tokens/s, TTFT, TPOT percentiles")
    bench_serve.add_arguments(serve)
    serve.set_defaults(func=bench_serve.run)


def weight_bytes_per_token(model_file) -> int:
    """Every weight is read once per token, except the embedding table, of which one row is, and
    a mixture of experts' expert tensors, of which the n_expert_used chosen experts' rows are."""
    c = model_file.config
    total = sum(t.n_bytes * c.n_expert_used // c.n_expert if "_exps." in name else t.n_bytes
                for name, t in model_file.tensors.items())
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
        # greedy decode as generation runs it (steps queued ahead), from position 1 like llama.cpp's tg
        runner.prefill(tokens[:1], 0, engine.chunk)
        gpu, start = 0.0, time.perf_counter()
        for _ in runner.greedy(1, n_gen):
            gpu += runner.last_gpu_seconds()
        wall = time.perf_counter() - start
        tg.append(n_gen / wall)
        host.append((wall - gpu) / n_gen)
    return {"pp": statistics.median(pp[1:]), "tg": statistics.median(tg[1:]), "host": statistics.median(host[1:])}


def run(args):
    from vkllm.errors import VkllmError
    if not args.model:
        raise VkllmError("bench needs -m FILE (or the 'kernels' subcommand)")
    if args.batch:
        from worker.tools import bench_batch
        for path in args.model:
            engine = bench_batch.load(path, settings(args), args.batch, args.n_prompt, args.n_gen)
            try:
                print(f"{path}: {args.n_prompt}-token prompts, {args.n_gen} tokens each", flush=True)
                bench_batch.run(engine, args.batch, args.n_prompt, args.n_gen, args.repetitions)
                if args.profile:
                    bench_batch.print_pass_profiles(engine, args.batch, args.n_prompt)
            finally:
                engine.close()
        return
    if args.ctx is not None and args.ctx < args.n_prompt + args.n_gen:
        raise VkllmError(f"--ctx {args.ctx} holds fewer positions than -p {args.n_prompt} and -n {args.n_gen}")
    rows = []
    for path in args.model:
        rows.append(bench_model(path, args))
    header = (f"{'model':28} {'GB/tok':>7} {'engine':17} {'pp' + str(args.n_prompt):>9} {'tg' + str(args.n_gen):>8} "
              f"{'ms/tok':>7} {'host us/tok':>11} {'% roofline':>10}")
    print(header)
    for name, per_token, roofline, results in rows:
        for engine_name, r in results.items():
            _print_row(name, per_token, engine_name, r, roofline)
        if "llama.cpp-vulkan" in results:
            ours, peer = results["vkllm"], results["llama.cpp-vulkan"]
            print(f"{'':28} vkllm / llama.cpp: pp {ours['pp'] / peer['pp']:.2f}x, tg {ours['tg'] / peer['tg']:.2f}x")


def bench_model(path: str, args) -> tuple[str, int, float, dict]:
    """(name, weight bytes per token, measured read roofline, {engine: figures}) for one file."""
    from pathlib import Path

    from worker.engine.engine import Engine
    from worker.engine.kernels import experts
    from worker.engine.kernels.paths import decode_x8, mat_mat_path
    from worker.engine.modelfile import ModelFile
    from worker.tools.roofline import read_bandwidth
    n_ctx = args.ctx or args.n_prompt + args.n_gen + 16
    engine = Engine.load(path, settings(args), n_ctx=n_ctx, max_batch=min(512, args.n_prompt))
    try:
        per_token = weight_bytes_per_token(ModelFile.open(path))
        _, total = engine.ctx.memory_budget()
        roofline = read_bandwidth(engine.ctx, min(1 << 30, total // 8))
        results = {"vkllm": time_engine(engine, args.n_prompt, args.n_gen, args.repetitions)}
        if args.profile:
            print(f"{path}:")
            print_profile(engine, args.n_prompt)
        vocab, prefill_kernel = engine.config.vocab_size, mat_mat_path(engine.ctx)
        decode_kernel = "x8" if decode_x8(engine.ctx) else "mat_vec"
        if engine.config.n_expert:
            prefill_kernel += f", experts {experts.path(engine.ctx, engine.chunk)}"
    finally:
        engine.close()
    print(f"{path}: {per_token / 1e9:.3f} GB of weights read per token; measured read roofline "
          f"{roofline / 1e12:.3f} TB/s -> at most {roofline / per_token:.0f} tok/s; mat-mat kernel "
          f"{prefill_kernel} (VKLLM_PREFILL_KERNEL); decode kernel {decode_kernel} (VKLLM_DECODE_KERNEL); "
          f"context {n_ctx}", flush=True)
    _print_figures(path, "vkllm", results["vkllm"], args)
    if args.peer:
        from worker.tools.bench_peer import time_llama_cpp
        results["llama.cpp-vulkan"] = time_llama_cpp(path, vocab, args.n_prompt, args.n_gen, args.repetitions, n_ctx)
        _print_figures(path, "llama.cpp-vulkan", results["llama.cpp-vulkan"], args)
    return Path(path).stem, per_token, roofline, results


def _print_figures(path: str, engine: str, r: dict, args):
    """One engine's figures as soon as they are measured: the table comes after every model, so a
    run cut short (a device call's time limit) keeps what it measured."""
    print(f"{path}: {engine} pp{args.n_prompt} {r['pp']:.1f} tok/s, tg{args.n_gen} {r['tg']:.1f} tok/s", flush=True)


def print_profile(engine, n_prompt: int):
    """Per-kernel GPU time (timestamps after every dispatch) of a decode step at position
    n_prompt and of a prefill chunk; each dispatch's time includes the barrier before it."""
    chunk = min(engine.chunk, n_prompt)
    for title, n, pos in (("decode step", 1, n_prompt), (f"prefill chunk of {chunk}", chunk, 0)):
        table = engine.runner.profile(n, pos)
        total = sum(ns for _, ns in table.values())
        dispatches = sum(c for c, _ in table.values())
        print(f"{title}: {total / 1e6:.3f} ms GPU in {dispatches} dispatches "
              f"({dispatches / engine.config.n_layer:.1f} per layer)")
        for name, (count, ns) in sorted(table.items(), key=lambda item: -item[1][1]):
            print(f"  {name:28} {count:5d} x {ns / count / 1e3:8.1f} us = {ns / 1e6:8.3f} ms "
                  f"({100 * ns / total:4.1f}%)")


def _print_row(model, per_token, engine, r, roofline):
    host_us = f"{r['host'] * 1e6:.0f}" if r.get("host") is not None else "-"
    print(f"{model:28} {per_token / 1e9:7.3f} {engine:17} {r['pp']:9.1f} {r['tg']:8.1f} {1e3 / r['tg']:7.2f} "
          f"{host_us:>11} {100 * r['tg'] * per_token / roofline:9.1f}%", flush=True)

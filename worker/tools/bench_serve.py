"""`vkllm bench serve`: N jobs of given prompt and output lengths, all submitted at once, either
through the real API (--url, --api-key, --model NAME: each job posted and followed over its SSE
stream, as clients do) or straight into a model's continuous batch (--engine FILE: the worker's
engine, no Redis). Reports what vLLM's benchmark_serving does: aggregate output tokens/s, time to
first token (TTFT) and time per output token after the first (TPOT), mean and percentiles.

Prompts are random words (API) or random token ids (engine), a different one per job, after an
optional prefix all jobs share (--prefix-tokens: what prefix caching saves). A job may stop
before --output-tokens (end of generation): the figures count the tokens each job produced.
With --prefix-tokens, after the load: one job alone whose prefix (a new one) nothing has cached,
then one more sharing that prefix, one token each: their TTFTs and the second's share of the
first's (the issue's "second job sharing a 2k-token prefix" figure), timed after a first such
pair has warmed up their passes."""
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, replace

import numpy as np

from vkllm.argtypes import count, whole
from vkllm.config import CommandDefaults
from vkllm.errors import VkllmError

PERCENTILES = (50, 90, 99)
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word").split()


@dataclass
class Trace:
    """One job as its client saw it (monotonic seconds)."""
    submitted: float
    first: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None
    cached_tokens: int | None = None   # prompt tokens found in the prefix cache (engine mode)


def add_arguments(p) -> None:
    env = CommandDefaults.from_env()
    p.add_argument("--url", default=env.url, help="the web app (API mode)")
    p.add_argument("--api-key", default=env.api_key)
    p.add_argument("--model", help="the model's name (API mode)")
    p.add_argument("--engine", help="GGUF file: drive its engine's batch in this process instead of the API")
    p.add_argument("-n", "--num-jobs", type=count, default=8)
    p.add_argument("-p", "--prompt-tokens", type=count, default=128, help="tokens per prompt, after the prefix")
    p.add_argument("--prefix-tokens", type=whole, default=0,
                   help="tokens of a prefix every prompt starts with; then also the TTFT of a job alone and of the "
                        "next one sharing its prefix")
    p.add_argument("-o", "--output-tokens", type=count, default=256)
    p.add_argument("--seed", type=whole, default=0, help="seed of the random prompts")
    p.add_argument("--peer", choices=["llama.cpp"],
                   help="with --engine: the same prompts as parallel sequences of llama.cpp's Vulkan backend (cyllama)")


def run(args) -> int:
    if args.peer and not args.engine:
        raise VkllmError("--peer compares with --engine (the same prompts, as token ids)")
    if args.engine:
        prompts, traces, reuse = engine_traces(args)
    elif args.model:
        traces, reuse = api_traces(args)
    else:
        raise VkllmError("bench serve needs --model NAME (through the API at --url) or --engine FILE")
    ours = summary(traces)
    print(report(ours))
    if reuse:
        print(reuse_report(args.prefix_tokens, *reuse))
    if args.peer:
        from worker.tools.bench_peer import serve_llama_cpp
        peer = summary([Trace(*t) for t in serve_llama_cpp(args.engine, prompts, args.output_tokens)])
        print("llama.cpp-vulkan, parallel sequences of one context:")
        print(report(peer))
        print(f"vkllm / llama.cpp: output tok/s {ours['output_tokens_per_s'] / peer['output_tokens_per_s']:.2f}x, "
              f"TTFT p50 {ours['ttft_ms']['p50'] / peer['ttft_ms']['p50']:.2f}x, "
              f"TPOT p50 {ours['tpot_ms']['p50'] / peer['tpot_ms']['p50']:.2f}x")
    return 0


def summary(traces: list[Trace]) -> dict:
    done = [t for t in traces if t.error is None and t.first is not None]
    if not done:
        raise VkllmError("no job produced a token: " + "; ".join(t.error or "no output" for t in traces))
    duration = max(t.ended for t in done) - min(t.submitted for t in traces)
    ttft = np.array([t.first - t.submitted for t in done])
    tpot = np.array([(t.ended - t.first) / (t.output_tokens - 1) for t in done if t.output_tokens > 1])
    out = sum(t.output_tokens for t in done)
    return {"jobs": len(traces), "completed": len(done), "duration_s": duration,
            "prompt_tokens": sum(t.prompt_tokens for t in done), "output_tokens": out,
            "output_tokens_per_s": out / duration, "jobs_per_s": len(done) / duration,
            "ttft_ms": _stats(ttft), "tpot_ms": _stats(tpot)}


def prefix_pair(run_one, new_prefix, suffixes: list) -> tuple[Trace, Trace]:
    """run_one(prompt) -> Trace of one job run alone: prefix + suffixes[0], then prefix +
    suffixes[1], for a prefix nothing has cached (`new_prefix()` makes one). The pair runs twice
    and the second is returned: the first records the passes of those lengths and builds their
    pipelines, which the load's shapes may not have (the 8B on the H200: 3.5 s for a 2112-token
    prompt alone the first time, 0.6 s after)."""
    for _ in range(2):
        prefix = new_prefix()
        pair = run_one(prefix + suffixes[0]), run_one(prefix + suffixes[1])
    return pair


def reuse_report(prefix_tokens: int, cold: Trace, warm: Trace) -> str:
    for trace in (cold, warm):
        if trace.error is not None or trace.first is None:
            raise VkllmError(f"a prefix-reuse job produced no token: {trace.error or 'no output'}")
    first, second = ((t.first - t.submitted) * 1e3 for t in (cold, warm))
    cached = [f" ({t.cached_tokens} of {t.prompt_tokens} prompt tokens cached)" if t.cached_tokens is not None else ""
              for t in (cold, warm)]
    return (f"Prefix reuse ({prefix_tokens} tokens): TTFT {first:.2f} ms alone{cached[0]}, {second:.2f} ms for the "
            f"next job sharing it{cached[1]}: {second / first:.2f}x")


def _stats(seconds: np.ndarray) -> dict:
    if not len(seconds):
        return {}
    ms = seconds * 1e3
    return {"mean": float(ms.mean())} | {f"p{q}": float(np.percentile(ms, q)) for q in PERCENTILES}


def report(s: dict) -> str:
    """The summary laid out as vLLM's benchmark_serving prints it."""
    rows = [("Successful jobs:", f"{s['completed']} / {s['jobs']}"),
            ("Benchmark duration (s):", f"{s['duration_s']:.2f}"),
            ("Total prompt tokens:", s["prompt_tokens"]), ("Total generated tokens:", s["output_tokens"]),
            ("Job throughput (jobs/s):", f"{s['jobs_per_s']:.2f}"),
            ("Output token throughput (tok/s):", f"{s['output_tokens_per_s']:.2f}")]
    lines = ["{:=^50}".format(" Serving Benchmark Result ")] + [f"{name:<40}{value!s:>10}" for name, value in rows]
    for title, key, short in (("Time to First Token", "ttft_ms", "TTFT"),
                              ("Time per Output Token (excl. 1st token)", "tpot_ms", "TPOT")):
        lines.append("{:-^50}".format(title))
        for stat, value in s[key].items():
            label = f"{'Mean' if stat == 'mean' else stat.upper()} {short} (ms):"
            lines.append(f"{label:<40}{value:>10.2f}")
    lines.append("=" * 50)
    return "\n".join(lines)


# -- through the API -----------------------------------------------------------------------------
def _words(rng, n: int) -> str:
    return " ".join(rng.choice(WORDS, n))


def api_traces(args) -> tuple[list[Trace], tuple[Trace, Trace] | None]:
    """The load's traces, and the prefix-reuse pair's (None without --prefix-tokens)."""
    rng = np.random.default_rng(args.seed)
    prefix = _words(rng, args.prefix_tokens) + " " if args.prefix_tokens else ""
    prompts = [prefix + _words(rng, args.prompt_tokens) for _ in range(args.num_jobs)]
    traces = [Trace(0.0) for _ in prompts]
    start = threading.Barrier(len(prompts))
    threads = [threading.Thread(target=_api_job, args=(args, prompt, trace, start), daemon=True)
               for prompt, trace in zip(prompts, traces)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not args.prefix_tokens:
        return traces, None

    def run_one(prompt: str) -> Trace:
        trace = Trace(0.0)
        _api_job(args, prompt, trace, threading.Barrier(1), max_tokens=1)
        return trace
    return traces, prefix_pair(run_one, lambda: _words(rng, args.prefix_tokens) + " ",
                               [_words(rng, args.prompt_tokens) for _ in range(2)])


def _api_job(args, prompt: str, trace: Trace, start: threading.Barrier, max_tokens: int | None = None) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}", "Content-Type": "application/json"}
    body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens or args.output_tokens, "temperature": 0,
            "ignore_eos": True}   # every job produces its tokens
    start.wait()
    trace.submitted = time.monotonic()
    try:
        request = urllib.request.Request(f"{args.url}/api/v1/jobs", json.dumps(body).encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=60) as r:
            job = json.load(r)
        follow = urllib.request.Request(f"{args.url}/api/v1/jobs/{job['id']}/stream", headers=headers)
        with urllib.request.urlopen(follow, timeout=3600) as r:
            for kind, data in _sse(r):
                if kind == "token" and trace.first is None:
                    trace.first = time.monotonic()
                elif kind in ("end", "error"):
                    trace.ended = time.monotonic()
                    if kind == "error":
                        trace.error = data["error"]
                    else:
                        trace.prompt_tokens = data["usage"]["prompt_tokens"]
                        trace.output_tokens = data["usage"]["completion_tokens"]
                    return
    except OSError as e:   # urllib's errors, refused connections, timeouts
        trace.error = str(e)


def _sse(response):
    """(event, data) of a Server-Sent Events body as it arrives."""
    kind = None
    for raw in response:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and kind is not None:
            yield kind, json.loads(line[6:])
            kind = None


# -- straight into the engine's batch --------------------------------------------------------------
def engine_traces(args) -> tuple[list[list[int]], list[Trace], tuple[Trace, Trace] | None]:
    """The prompts (token ids), their traces, and the prefix-reuse pair's (None without
    --prefix-tokens)."""
    from vkllm import sampling_defaults
    from worker.engine.batch import Request
    from worker.engine.config import Settings
    from worker.engine.engine import Engine
    from worker.engine.sampling import SamplingParams
    n_ctx = args.prefix_tokens + args.prompt_tokens + args.output_tokens + 16
    engine = Engine.load(args.engine, Settings.from_env(), n_ctx=n_ctx)
    try:
        rng, vocab = np.random.default_rng(args.seed), engine.config.vocab_size

        def prompts():
            prefix = rng.integers(0, vocab, args.prefix_tokens).tolist()
            return [prefix + rng.integers(0, vocab, args.prompt_tokens).tolist() for _ in range(args.num_jobs)]
        params = SamplingParams(**sampling_defaults.fill({"max_tokens": args.output_tokens, "temperature": 0,
                                                          "ignore_eos": True},
                                                         engine.sampling_defaults))
        # a warm-up first, the same load with other prompts (nothing the timed run could find
        # in the prefix cache), a few tokens each: the GPU idles at a low clock, and each batch
        # shape's pass is recorded (and its pipelines built) on first use
        _drive(engine.batch, [Request(ids, replace(params, max_tokens=16)) for ids in prompts()])
        timed = prompts()
        traces = _drive(engine.batch, [Request(ids, params) for ids in timed])
        if not args.prefix_tokens:
            return timed, traces, None
        one = replace(params, max_tokens=1)

        def run_one(ids: list[int]) -> Trace:
            hits = engine.batch.stats()["prefix_hit_tokens"]
            trace = _drive(engine.batch, [Request(ids, one)])[0]
            trace.cached_tokens = engine.batch.stats()["prefix_hit_tokens"] - hits
            return trace
        reuse = prefix_pair(run_one, lambda: rng.integers(0, vocab, args.prefix_tokens).tolist(),
                            [rng.integers(0, vocab, args.prompt_tokens).tolist() for _ in range(2)])
        return timed, traces, reuse
    finally:
        engine.close()


def _drive(batch, requests: list) -> list[Trace]:
    """All requests submitted now; each joins as soon as the batch has room, as in the worker."""
    now = time.monotonic()
    traces, waiting = [Trace(now, prompt_tokens=len(r.ids)) for r in requests], list(enumerate(requests))
    while waiting or len(batch):
        while waiting and batch.room():
            i, request = waiting.pop(0)
            batch.add(request, tag=i)
        for seq, event in batch.step():
            trace = traces[seq.tag]
            if event.finish_reason is None:
                trace.first = trace.first or time.monotonic()
            else:
                trace.ended, trace.output_tokens = time.monotonic(), event.timings.generated_tokens
    return traces

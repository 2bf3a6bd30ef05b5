"""`vkllm models inspect | fetch-demo | synth`: look at a GGUF before loading it, get the demo
model, write synthetic ones."""
from collections import defaultdict

from vkllm.argtypes import count, whole
from worker.engine.config import Settings
from worker.engine.memplan import human_bytes as _size
from worker.tools.devices import add_device_arguments


def register(sub):
    models = sub.add_parser("models", help="inspect, fetch and synthesize GGUF models")
    cmds = models.add_subparsers(dest="models_command", required=True)

    inspect = cmds.add_parser("inspect", help="architecture, size, quant mix and memory plan of a GGUF")
    inspect.add_argument("file")
    inspect.add_argument("-c", "--ctx", type=count, help="context for the memory plan "
                         "(default: the model's context length)")
    add_device_arguments(inspect)
    inspect.set_defaults(func=_inspect)

    fetch = cmds.add_parser("fetch-demo", help="put SmolLM2-135M-Instruct into the models folder")
    fetch.add_argument("dir", nargs="?", help="target folder (default: $VKLLM_MODELS_DIR)")
    fetch.set_defaults(func=_fetch_demo)

    from worker.tools.synth import PRESETS
    from worker.tools.synthmix import MIXES
    synth = cmds.add_parser("synth", help="write a model with random weights in a real shape")
    synth.add_argument("preset", choices=sorted(PRESETS))
    synth.add_argument("out")
    synth.add_argument("--mix", default="Q4_K_M", choices=list(MIXES))
    synth.add_argument("--seed", type=whole, default=0)
    synth.set_defaults(func=_synth)


def _open(settings) -> tuple[list, str]:
    """The contexts of settings' devices (as Engine.load opens them), or none and why: without a
    driver or device the plan leaves out what depends on it (the chunk, the kernels' scratch)."""
    try:
        from worker.engine.engine import open_contexts
        return open_contexts(settings), ""
    except ImportError as e:
        return [], f"unavailable ({e})"
    except Exception as e:   # no driver, no device: inspect still shows the plan
        return [], f"unavailable ({type(e).__name__}: {e})"


def _budget(settings, ctx) -> tuple[int, str]:
    """Bytes available on a context's device, and their description."""
    free, (_, total) = ctx.available(settings.gpu_memory_utilization), ctx.memory_budget()
    share = settings.gpu_memory_utilization
    limit = "" if share == 1 else f" (--gpu-memory-utilization {share:g})"
    return free, f"{_size(free)} available of {_size(total)}{limit}"


def _plans(model, ctxs: list, settings, n_ctx: int, budgets: list[int], ranges: list):
    """A plan of one context of n_ctx tokens per device of `ranges` (n_ctx as asked: the engine
    caps it at the model's), and Engine.load's plans with their KV pool (None: they do not fit).
    Both take the prefill chunk and the scratch the engine takes on these devices."""
    from vkllm.errors import VkllmError
    from worker.engine.memplan import PREFILL_CHUNK, MemoryPlan
    c, pool, chunk, scratch = model.config, None, PREFILL_CHUNK, 0
    if ctxs:
        from worker.engine.engine import kernel_scratch, plan_memory, prefill_chunks
        try:
            pool = plan_memory(model, ctxs, settings, n_ctx, budgets, ranges)
        except VkllmError:   # the one-context plans say why
            pass
        chunk = pool[0].chunk if pool else prefill_chunks(ctxs)[0]
        scratch = kernel_scratch(ctxs, c, settings.max_sequences)(chunk, n_ctx)
    sequences = pool[0].sequences if pool else settings.max_sequences
    plans = [MemoryPlan.compute(model, c, n_ctx, chunk, scratch, sequences, settings.kv_type, layers=layers,
                                first=i == 0, last=i == len(ranges) - 1) for i, layers in enumerate(ranges)]
    return plans, pool


def _chunk_row(plan, known: bool) -> str:
    from worker.engine.memplan import CPU_PREFILL_CHUNK, MATRIX_UNIT_CHUNKS
    why = (f"the scratch holds a pass of them, with logits rows for {plan.sequences} sequences" if known else
           f"no device, which decides: {CPU_PREFILL_CHUNK} on a CPU driver, up to {MATRIX_UNIT_CHUNKS[-1]} "
           "on matrix units")
    return f"prefill chunk   {plan.chunk} tokens ({why})"


def _inspect(args):
    from worker.engine.modelfile import ModelFile
    model = ModelFile.open(args.file)
    c = model.config
    n_ctx = args.ctx or c.context_length
    mix = defaultdict(lambda: [0, 0])
    for t in model.tensors.values():
        mix[t.ggml_type.name][0] += 1
        mix[t.ggml_type.name][1] += t.n_bytes
    rows = [("file", str(model.path)), ("architecture", c.arch),
            ("name", c.name), ("parameters", f"{model.n_params / 1e6:,.1f} M"),
            ("file size", _size(model.file_size)), ("context length", f"{c.context_length} tokens"),
            ("shape", f"{c.n_layer} layers, {c.n_embd} wide, ffn {c.n_ff}, {c.n_head} heads "
                      f"({c.n_head_kv} kv) of {c.head_dim}, vocab {c.vocab_size}"),
            ("rope", f"base {c.rope_base:g}, {'neox' if c.rope_neox else 'normal'}"
                     f"{', freq factors' if c.rope_freq_factors else ''}"),
            ("extras", ", ".join(name for name, on in (("tied embeddings", c.tied_embeddings),
                                 ("qkv bias", c.has_qkv_bias), ("q/k norm", c.has_qk_norm),
                                 ("embeddings x sqrt(n_embd)", c.embedding_scale != 1.0),
                                 ("post norms", c.has_post_norms), ("GeGLU", c.ffn_gelu)) if on)
             or "-")]
    if c.n_expert:
        weights = "softmax of the chosen" if c.expert_softmax_chosen else \
            "softmax" + (", renormalised" if c.expert_weights_norm else "")
        rows.append(("experts", f"{c.n_expert_used} of {c.n_expert} per token, {c.n_ff_exp} rows each, "
                                f"weights {weights}" + (", biases, clamped SwiGLU" if c.ffn_oai else "")
                                + (f", shared expert of {c.n_ff_shexp} rows" if c.n_ff_shexp else "")))
    if c.has_attn_sinks:
        rows.append(("attention", "sinks (a logit per head in the softmax denominator), output bias"))
    if c.sliding_window:
        rows.append(("sliding window", f"{c.sliding_window} positions on {sum(c.swa_layers)} of {c.n_layer} "
                                       f"layers, rope base {c.rope_base_swa:g} there"))
    if model.overridden:
        from vkllm.overrides import path_for
        rows.append(("overrides", f"{path_for(model.path)}: {', '.join(model.overridden)}"))
    for name, value in rows:
        print(f"{name:15} {value}")
    print(f"sampling        {_sampling(model, n_ctx)}")
    print("quant mix")
    for name, (count, n_bytes) in sorted(mix.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:7} {count:5} tensors  {_size(n_bytes):>12}")
    from worker.tools.devices import settings as command_settings
    settings = command_settings(args)
    ctxs, unavailable = _open(settings)
    try:
        (_inspect_split if settings.devices is not None else _inspect_one)(model, n_ctx, settings, ctxs, unavailable)
    finally:
        for ctx in ctxs:
            ctx.close()


def _inspect_one(model, n_ctx: int, settings, ctxs: list, unavailable: str):
    from vkllm.errors import VkllmError
    budget, device = _budget(settings, ctxs[0]) if ctxs else (None, unavailable)
    (plan,), pool = _plans(model, ctxs, settings, n_ctx, [budget], [None])
    print(f"memory plan     n_ctx {n_ctx}: weights {_size(plan.weights_bytes)} + KV cache "
          f"{_size(plan.kv_bytes)} + scratch {_size(plan.scratch_bytes)} = {_size(plan.total)}")
    print(_chunk_row(plan, bool(ctxs)))
    print(f"device budget   {device}")
    if budget is None:
        return
    try:
        plan.check(budget)
    except VkllmError as e:
        print(f"fits            no: {e}")
        return
    print("fits            yes")
    print(f"batching        {pool[0].sequences} sequences (VKLLM_MAX_SEQUENCES {settings.max_sequences}), "
          f"{settings.kv_type} KV pool of {pool[0].kv_tokens} tokens = {_size(pool[0].kv_bytes)}")


def _inspect_split(model, n_ctx: int, settings, ctxs: list, unavailable: str):
    """The plan of each device of settings.devices: the layers it takes (by settings.split, else
    in proportion to free memory) and what it holds; refused, naming the largest context that
    fits them all, when the model cannot be placed."""
    from vkllm.errors import VkllmError
    from worker.engine.memplan import NO_LIMIT, check_split, layer_range, layer_shares
    from worker.engine.placement import shared_budgets, split_layers
    c, count = model.config, len(settings.devices)
    free = [_budget(settings, ctx) for ctx in ctxs]
    budgets = shared_budgets([f for f, _ in free], [ctx.info.index for ctx in ctxs]) if ctxs else [NO_LIMIT] * count
    devices = [d for _, d in free] or [unavailable] * count
    ranges = split_layers(c.n_layer, settings.split or (layer_shares(model, budgets) if ctxs else [1] * count))
    plans, pool = _plans(model, ctxs, settings, n_ctx, budgets, ranges)
    print(f"memory plan     n_ctx {n_ctx}, layers split across {len(ranges)} devices")
    for i, (plan, budget, device) in enumerate(zip(plans, budgets, devices)):
        share = f"{_size(budget)} of the device's " if ctxs else ""
        print(f"  device {i} ({settings.devices[i]}): {layer_range(ranges[i])}{' + embeddings' if i == 0 else ''}"
              f"{' + output' if i == len(ranges) - 1 else ''}: weights {_size(plan.weights_bytes)} + KV cache "
              f"{_size(plan.kv_bytes)} + scratch {_size(plan.scratch_bytes)} = {_size(plan.total)}; "
              f"budget {share}{device}")
    print(_chunk_row(plans[0], bool(ctxs)))
    if not ctxs:
        return
    try:
        check_split(plans, budgets)
    except VkllmError as e:
        print(f"fits            no: {e}")
        return
    print("fits            yes")
    print(f"batching        {pool[0].sequences} sequences (VKLLM_MAX_SEQUENCES {settings.max_sequences}), "
          f"{settings.kv_type} KV pool of {pool[0].kv_tokens} tokens on every device")


def _sampling(model, n_ctx: int) -> str:
    """What a request that sets no sampling parameter gets, marking the values the model gives
    (its GGUF, or the overrides file beside it)."""
    from vkllm.sampling_defaults import GGUF_KEYS, model_values
    from worker.engine.sampling import model_defaults
    own = model_values(model.metadata, n_ctx)

    def source(name, value):
        if name not in own or own[name] != value:
            return ""
        return " (override)" if GGUF_KEYS[name] in model.overridden else " (GGUF)"
    return ", ".join(f"{name} {value:g}{source(name, value)}"
                     for name, value in model_defaults(model.metadata, n_ctx).items())


def _fetch_demo(args):
    from vkllm.demo import fetch_demo
    folder = args.dir or Settings.from_env().models_dir
    print(fetch_demo(folder))


def _synth(args):
    from tqdm import tqdm

    from worker.tools.synth import PRESETS, tensor_specs, write_model
    n_tensors = len(tensor_specs(PRESETS[args.preset], args.mix))
    with tqdm(total=n_tensors, unit="tensor", desc=args.preset) as bar:
        write_model(args.preset, args.out, args.mix, args.seed,
                    progress=lambda name, n: bar.update(1))
    print(args.out)

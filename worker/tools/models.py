"""`vkllm models inspect | fetch-demo | synth`: look at a GGUF before loading it, get the demo
model, write synthetic ones."""
from collections import defaultdict

from worker.engine.config import Settings
from worker.engine.memplan import human_bytes as _size
from worker.tools.devices import add_device_arguments


def register(sub):
    models = sub.add_parser("models", help="inspect, fetch and synthesize GGUF models")
    cmds = models.add_subparsers(dest="models_command", required=True)

    inspect = cmds.add_parser("inspect", help="architecture, size, quant mix and memory plan of a GGUF")
    inspect.add_argument("file")
    inspect.add_argument("-c", "--ctx", type=int, help="context for the memory plan "
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
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(func=_synth)


def _device(settings, config, n_ctx: int):
    """(bytes available, device description, bytes of the kernels' scratch on it, its index), or (None,
    why not, 0, None): without a device the plan leaves out the kernels' scratch, which depends on it."""
    try:
        from worker.engine.kernels.shapes import AttentionShape
        from worker.engine.memplan import PREFILL_CHUNK
        from worker.engine.vk.context import Context
        from worker.engine.workspace import Workspace
        ctx = Context(settings)
        try:
            free, (_, total) = ctx.available(settings.gpu_memory_utilization), ctx.memory_budget()
            index = ctx.info.index
            shape = AttentionShape.from_config(config, n_ctx)
            scratch = sum(Workspace.kernel_sizes(ctx, config, PREFILL_CHUNK, shape).values())
        finally:
            ctx.close()
    except ImportError as e:
        return None, f"unavailable ({e})", 0, None
    except Exception as e:   # no driver, no device: inspect still shows the plan
        return None, f"unavailable ({type(e).__name__}: {e})", 0, None
    share = settings.gpu_memory_utilization
    limit = "" if share == 1 else f" (--gpu-memory-utilization {share:g})"
    return free, f"{_size(free)} available of {_size(total)}{limit}", scratch, index


def _inspect(args):
    from vkllm.errors import VkllmError
    from worker.engine.memplan import PREFILL_CHUNK, MemoryPlan, plan_context
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
        from worker.engine.overrides import path_for
        rows.append(("overrides", f"{path_for(model.path)}: {', '.join(model.overridden)}"))
    for name, value in rows:
        print(f"{name:15} {value}")
    print(f"sampling        {_sampling(model, n_ctx)}")
    print("quant mix")
    for name, (count, n_bytes) in sorted(mix.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:7} {count:5} tensors  {_size(n_bytes):>12}")
    from worker.tools.devices import settings as command_settings
    settings = command_settings(args)
    if settings.devices is not None:
        _inspect_split(model, n_ctx, settings)
        return
    budget, device, kernel_scratch, _ = _device(settings, c, n_ctx)
    plan = MemoryPlan.compute(model, c, n_ctx, kernel_scratch=kernel_scratch)
    print(f"memory plan     n_ctx {n_ctx}: weights {_size(plan.weights_bytes)} + KV cache "
          f"{_size(plan.kv_bytes)} + scratch {_size(plan.scratch_bytes)} = {_size(plan.total)}")
    print(f"device budget   {device}")
    if budget is not None:
        try:
            plan.check(budget)
            print("fits            yes")
        except VkllmError as e:
            print(f"fits            no: {e}")
            return
        pool = plan_context(model, c, n_ctx, n_ctx, PREFILL_CHUNK, budget, lambda n: kernel_scratch,
                            settings.max_sequences, settings.kv_type)
        print(f"batching        {pool.sequences} sequences (VKLLM_MAX_SEQUENCES {settings.max_sequences}), "
              f"{settings.kv_type} KV pool of {pool.kv_tokens} tokens = {_size(pool.kv_bytes)}")


def _inspect_split(model, n_ctx: int, settings):
    """The plan of each device of settings.devices: the layers it takes (by settings.split, else
    in proportion to free memory) and what it holds; refused, naming the largest context that
    fits them all, when the model cannot be placed."""
    from dataclasses import replace

    from vkllm.errors import VkllmError
    from worker.engine.memplan import PREFILL_CHUNK, MemoryPlan, check_split, layer_range, layer_shares, plan_split
    from worker.engine.placement import shared_budgets, split_layers
    c = model.config
    devices = [_device(replace(settings, device=d), c, n_ctx) for d in settings.devices]
    known = all(budget is not None for budget, *_ in devices)
    budgets = shared_budgets([budget for budget, *_ in devices], [index for *_, index in devices]) if known \
        else [1 << 62] * len(devices)
    ranges = split_layers(c.n_layer, settings.split or (layer_shares(model, budgets) if known else [1] * len(devices)))
    scratch = max(kernel_scratch for _, _, kernel_scratch, _ in devices)
    plans = [MemoryPlan.compute(model, c, n_ctx, kernel_scratch=scratch, layers=layers, first=i == 0,
                                last=i == len(ranges) - 1) for i, layers in enumerate(ranges)]
    print(f"memory plan     n_ctx {n_ctx}, layers split across {len(ranges)} devices")
    for i, (plan, budget, (_, device, _, _)) in enumerate(zip(plans, budgets, devices)):
        share = f"{_size(budget)} of the device's " if known else ""
        print(f"  device {i} ({settings.devices[i]}): {layer_range(ranges[i])}{' + embeddings' if i == 0 else ''}"
              f"{' + output' if i == len(ranges) - 1 else ''}: weights {_size(plan.weights_bytes)} + KV cache "
              f"{_size(plan.kv_bytes)} + scratch {_size(plan.scratch_bytes)} = {_size(plan.total)}; "
              f"budget {share}{device}")
    if not known:
        return
    try:
        check_split(plans, budgets)
    except VkllmError as e:
        print(f"fits            no: {e}")
        return
    print("fits            yes")
    pool = plan_split(model, c, n_ctx, n_ctx, (PREFILL_CHUNK,), budgets, ranges, lambda chunk, n: scratch,
                      settings.max_sequences, settings.kv_type)[0]
    print(f"batching        {pool.sequences} sequences (VKLLM_MAX_SEQUENCES {settings.max_sequences}), "
          f"{settings.kv_type} KV pool of {pool.kv_tokens} tokens on every device")


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

"""The inference engine: a GGUF model resident on a Vulkan device, generating text.

Importable without Flask or RQ. One Engine holds one model and its paged KV cache
(worker/engine/kvcache.py); `generate` runs one sequence, `batch` (worker/engine/batch.py) many
together. Both reuse the cached blocks of any prompt prefix seen before (prefix caching).
"""
import sys
import time
from contextlib import closing, contextmanager
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

from vkllm.errors import VkllmError
from worker.engine.batch import Batch
from worker.engine.chat import chat_prompt
from worker.engine.choice import MASKED, next_token, selection, token_logprobs
from worker.engine.config import Settings
from worker.engine.errors import PromptTooLong
from worker.engine.generation import Event, Timings, TokenLogprobs
from worker.engine.grammar import Constraint, GrammarError, grammar, lltokenizer
from worker.engine.kernels.cols_tuning import model_cols_shapes
from worker.engine.kernels.paged import row_bytes
from worker.engine.kernels.paths import mat_mat_path
from worker.engine.kernels.shapes import AttentionShape
from worker.engine.kernels.tile_tuning import model_tiles
from worker.engine.kernels.tuning import model_shapes
from worker.engine.kvcache import KVCache
from worker.engine.memplan import (
    CPU_PREFILL_CHUNK,
    MATRIX_UNIT_CHUNKS,
    POOL_SHARE,
    PREFILL_CHUNK,
    MemoryPlan,
    layer_shares,
    plan_split,
)
from worker.engine.modelfile import ModelFile
from worker.engine.models.model import Model, glu_keys, mat_vec_keys, residual_keys
from worker.engine.placement import shared_budgets, split_layers, stages
from worker.engine.runner import Runner
from worker.engine.sampling import Sampler, SamplingParams, StopMatcher, model_defaults
from worker.engine.tokenizer import StreamDecoder, Tokenizer
from worker.engine.toolcalls import format_for
from worker.engine.workspace import Workspace

DEFAULT_CONTEXT = 4096


def prefill_chunks(ctxs) -> tuple[int, ...]:
    """The prefill chunks a model's memory plan may take on these contexts, smallest first
    (memplan.plan_split): bigger ones only where every device's prefill takes its matrix units,
    CPU_PREFILL_CHUNK where one is a CPU driver."""
    if all(mat_mat_path(c) == "coopmat" for c in ctxs):
        return MATRIX_UNIT_CHUNKS
    return (CPU_PREFILL_CHUNK if any(c.info.kind == "cpu" for c in ctxs) else PREFILL_CHUNK,)


def kernel_scratch(ctxs, config, sequences: int) -> Callable[[int, int], int]:
    """Bytes of the kernels' scratch for a prefill chunk and a context (chunk, n_ctx) -> bytes:
    the most any of these contexts' devices takes."""
    return lambda chunk, n_ctx: max(sum(Workspace.kernel_sizes(c, config, chunk, AttentionShape.from_config(
        config, n_ctx), sequences).values()) for c in ctxs)


def plan_memory(model_file, ctxs, settings: Settings, n_ctx: int | None, budgets: list[int], ranges: list,
                max_batch: int | None = None, pool_share: float = POOL_SHARE) -> list[MemoryPlan]:
    """The memory plans a model loads with on these contexts, each holding the layers of `ranges`
    within its share of `budgets` (memplan.plan_split): the prefill chunk `max_batch`, else the
    largest of `prefill_chunks` that fits. Engine.load loads with them; `vkllm models inspect`
    shows them."""
    config = model_file.config
    chunks = (max_batch,) if max_batch is not None else prefill_chunks(ctxs)
    return plan_split(model_file, config, n_ctx, DEFAULT_CONTEXT, chunks, budgets, ranges,
                      kernel_scratch(ctxs, config, settings.max_sequences), settings.max_sequences,
                      settings.kv_type, min(c.max_binding_range for c in ctxs)
                      // row_bytes(settings.kv_type, config.n_head_kv * config.head_dim), pool_share)


class Engine:
    def __init__(self, placement, model_file, config, tokenizer, plans: list[MemoryPlan], owns_ctx: bool,
                 progress: bool = False, mat_vec_shapes: list[tuple[dict, dict, dict]] | None = None,
                 coopmat_tiles: list[dict] | None = None, cols_shapes: list[dict] | None = None):
        """`placement`: the Stages (worker/engine/placement.py), one per context, whose layers
        each runs (one for a model on one device); `plans`: each one's memory plan."""
        plan = plans[0]   # context, chunk and pool are the same on every device
        self.plans = plans
        n_ctx, max_batch = plan.n_ctx, plan.chunk
        self.placement, self.ctx = placement, placement[0].ctx
        self.config, self.tokenizer, self.n_ctx = config, tokenizer, n_ctx
        self.name = Path(model_file.path).stem
        self.chat_template = model_file.metadata.get("tokenizer.chat_template")
        self.info = {"architecture": config.arch, "context_length": config.context_length,
                     "file_size": model_file.file_size, "quant": _quant_name(model_file),
                     "parameters": model_file.n_params}
        # what a request that sets no sampling parameter runs with on this model
        self.sampling_defaults = model_defaults(model_file.metadata, n_ctx)
        self._owns_ctx = owns_ctx
        bar = _progress_bar(sum(t.n_bytes for t in model_file.tensors.values()), self.name) if progress else None
        # a slot per batched sequence and one for the runner's own (generate's)
        self.kv = KVCache(placement, config, n_ctx, plan.kv_blocks, plan.sequences + 1, plan.kv_type)
        self.model = Model(placement, model_file, config, n_ctx, self.kv, progress=bar.update if bar else None,
                           mat_vec_shapes=mat_vec_shapes, coopmat_tiles=coopmat_tiles,
                           cols_shapes=cols_shapes)
        if bar:
            bar.close()
        self.runner = Runner(self.model, max_batch, plan.sequences)
        self.chunk = max_batch
        self._cached: list[int] = []   # tokens whose K/V the runner's own sequence holds, in order
        self.batch = Batch(self, plan.sequences)

    @classmethod
    def load(cls, path, settings: Settings | None = None, n_ctx: int | None = None, ctx=None,
             max_batch: int | None = None, progress: bool = False, reserve: int = 0,
             pool_share: float = POOL_SHARE) -> "Engine":
        """Opens (`path`: a GGUF's path, or the ModelFile already opened), checks against the
        device's memory budget, and uploads a GGUF model. Without
        `n_ctx` the context is DEFAULT_CONTEXT, capped by the model's and by what fits. `ctx`
        shares an existing Vulkan context (tests, several models in one worker), or a list of
        them, across which the layers are split (in proportion to settings.split, else to each
        one's free memory); without it the engine opens one context per entry of
        settings.devices (one, settings.device, when that is unset). `settings` default to the
        first context's. Mat-vec shapes and cooperative-matrix tiles are tuned
        (worker/engine/kernels/tuning.py, tile_tuning.py) before the weights are uploaded, while
        the memory they will take is free for the timing copies. `max_batch` is the prefill
        chunk; without it `plan_memory` picks one of `prefill_chunks` for the device. On each
        device the model takes what Context.available leaves under settings.gpu_memory_utilization,
        less its share of `reserve` (bytes kept for models loaded after it), its KV pool at most
        `pool_share` of what one context leaves of that (worker/engine/resident.py)."""
        model_file = path if isinstance(path, ModelFile) else ModelFile.open(path)
        config = model_file.config
        try:
            tokenizer = Tokenizer.from_metadata(model_file.metadata)
        except VkllmError as e:   # as ModelFile.open's errors do, it names the file
            raise VkllmError(f"{model_file.path}: {e}") from None
        owns_ctx = ctx is None
        if owns_ctx:
            ctxs = open_contexts(settings or Settings())
        else:
            ctxs = list(ctx) if isinstance(ctx, (list, tuple)) else [ctx]
        ctx = ctxs[0]
        settings = settings or ctx.settings
        try:
            if settings.split is not None and len(settings.split) != len(ctxs):
                raise VkllmError(f"a split of {len(settings.split)} shares needs as many devices, not {len(ctxs)}")
            budgets = shared_budgets([c.available(settings.gpu_memory_utilization) for c in ctxs],
                                     [c.info.index for c in ctxs])
            budgets = [b - reserve * b // max(1, sum(budgets)) for b in budgets]
            placement = stages(ctxs, split_layers(config.n_layer, settings.split or layer_shares(model_file, budgets)))
            plans = plan_memory(model_file, ctxs, settings, n_ctx, budgets, [stage.layers for stage in placement],
                                max_batch, pool_share)
            # per context: kernels' shapes fit its device (two on one device share its cached timings)
            shapes = [model_shapes(c, settings, mat_vec_keys(model_file), glu_keys(model_file),
                                   residual_keys(model_file)) for c in ctxs]
            tiles = [model_tiles(c, settings, mat_vec_keys(model_file), plans[0].chunk) for c in ctxs]
            cols = [model_cols_shapes(c, settings, mat_vec_keys(model_file), glu_keys(model_file)) for c in ctxs]
            return cls(placement, model_file, config, tokenizer, plans, owns_ctx, progress, shapes, tiles, cols)
        except BaseException:
            if owns_ctx:
                for c in ctxs:
                    c.close()
            raise

    # -- text in, events out ---------------------------------------------------------------------
    def render_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The chat as prompt text for `generate` (template applied, generation prompt added);
        `tools` (OpenAI's function definitions) go to templates that describe them."""
        return chat_prompt(self.tokenizer, self.chat_template, messages, **({"tools": tools} if tools else {}))

    def constraint(self, spec: dict) -> Constraint:
        """A matcher for a request's constraint (worker/engine/grammar.py), at its start; raises
        GrammarError naming what the grammar library cannot enforce."""
        try:
            text = grammar(spec, format_for(self.chat_template))
        except (ValueError, TypeError) as e:   # a schema the compiler cannot even read
            raise GrammarError(str(e)) from None
        return Constraint(self._grammar_tokenizer, text)

    @cached_property
    def _grammar_tokenizer(self):
        """The vocabulary for the grammar library, built on first use (a fraction of a second)."""
        return lltokenizer(self.tokenizer, self.config.vocab_size)

    def generate(self, prompt: str, params: SamplingParams,
                 cancelled: Callable[[], bool] = lambda: False, logprobs: int | None = None,
                 constraint: dict | None = None) -> Iterator[Event]:
        ids = self.tokenizer.encode(prompt)
        yield from self.generate_ids(ids, params, cancelled, logprobs, constraint)

    def generate_ids(self, ids: list[int], params: SamplingParams,
                     cancelled: Callable[[], bool] = lambda: False, logprobs: int | None = None,
                     constraint: dict | None = None) -> Iterator[Event]:
        """Events for the tokens generated after `ids`. With `logprobs` set, each token event
        carries the token's log-probability and the `logprobs` most likely tokens' (0: none).
        With `constraint` (worker/engine/grammar.py) every token is one its grammar allows: the
        GPU masks the others' logits before the selection, and generation ends when the grammar
        is complete (only end-of-generation is then allowed)."""
        self.check_prompt(ids)
        matcher = self.constraint(constraint) if constraint is not None else None
        self.batch.settle()   # the runner's workspace is then this generation's until it ends
        started = time.perf_counter()
        # logprobs take their alternatives from the GPU's top-k (the sampler still gets what it needs)
        select = "topk" if logprobs is not None else selection(params)
        if matcher is not None:
            select += MASKED
            matcher.fill(self.runner.mask_words())
        self._prefill(ids, select)
        prompt_seconds = time.perf_counter() - started
        sampler = Sampler(params, self.config.vocab_size, self.tokenizer.eog_ids)
        decoder, stops = StreamDecoder(self.tokenizer), StopMatcher(params.stop)
        history, generated, first_token_at = list(ids), 0, None
        finish, matched_stop = "length", False
        # decode steps needed at most: one after each token but the last, within the context
        steps = max(0, min(params.max_tokens - 1, self.n_ctx - len(ids) - 1))
        # the steps still in flight end (closing) before the blocks go (releasing)
        with self._releasing(), closing(self._tokens(sampler, select, history, steps, logprobs, matcher)) as tokens:
            for token, logprobs_of_token in tokens:
                generated += 1
                first_token_at = first_token_at or time.perf_counter()
                if token in self.tokenizer.eog_ids and not params.ignore_eos:
                    finish = "stop"
                    break
                history.append(token)
                text, matched_stop = stops.push(decoder.push(token), params.stops_armed(generated))
                if matched_stop:
                    yield Event(text, token, logprobs=logprobs_of_token)
                    finish = "stop"
                    break
                yield Event(text, token, logprobs=logprobs_of_token)
                if generated >= params.max_tokens or len(history) >= self.n_ctx:
                    break
                if cancelled():
                    finish = "cancelled"
                    break
        # Text held back as a possible start of a stop string is released unless one matched.
        tail = "" if matched_stop else stops.push(decoder.flush(), params.stops_armed(generated))[0] + stops.flush()
        now = time.perf_counter()
        timings = Timings(prompt_tokens=len(ids), generated_tokens=generated, prompt_seconds=prompt_seconds,
                          generation_seconds=now - (first_token_at or now),
                          time_to_first_token=(first_token_at or now) - started)
        yield Event(tail, None, finish, timings)

    def check_prompt(self, ids: list[int]):
        if not ids:
            raise VkllmError("the prompt is empty")
        if len(ids) >= self.n_ctx:
            raise PromptTooLong(f"the prompt has {len(ids)} tokens; this model's context is {self.n_ctx}")

    def _prefill(self, ids: list[int], select: str):
        """Reuses the cached blocks of the prompt's longest cached prefix; at least the last
        prompt token is always run for its logits."""
        keep = self.runner.restart(ids)
        self._cached = ids[:keep]
        self.runner.prefill(ids[keep:], keep, self.chunk, select)
        self._cached.extend(ids[keep:])

    @contextmanager
    def _releasing(self):
        """At the end of a generation the runner's sequence lets its blocks go: the full ones
        it wrote stay cached for the prompts that follow, the rest return to the pool."""
        try:
            yield
        finally:
            self.runner.commit(self._cached, len(self._cached))
            self.runner.restart([])

    def _tokens(self, sampler, select: str, history: list[int], steps: int, logprobs: int | None,
                matcher: Constraint | None = None) -> Iterator[tuple[int, TokenLogprobs | None]]:
        """The generated tokens, each with its logprobs when asked (select is then "topk"):
        the prefill's pick, then one per decode step, at most `steps` steps. A step's input
        token joins the cached prefix once the step has run. The caller appends each token it
        keeps to `history` before asking for the next. With a matcher (select then ends in
        MASKED) each token is taken by it and the next step's mask written before the step:
        the mask depends on the token just picked, so greedy decode's pipelining is not used."""
        start = len(history)        # position of the first generated token
        token = next_token(self.runner, sampler, select, history)
        if select == "argmax":
            yield token, None
            with closing(self.runner.greedy(start, steps)) as following:
                for token_after in following:
                    self._cached.append(token)
                    token = token_after
                    yield token, None
            return
        for k in range(steps + 1):
            # read before the next step overwrites them
            yield token, None if logprobs is None else token_logprobs(
                self.runner.read_logits(), token, *self.runner.read_topk(), logprobs)
            if k == steps:
                return
            if matcher is not None:
                matcher.accept(token)
                matcher.fill(self.runner.mask_words())
            self.runner.decode(token, start + k, select)
            self._cached.append(token)
            token = next_token(self.runner, sampler, select, history)

    def logits(self, ids: list[int]):
        """Logits at every position of `ids` computed afresh (for tests and tools)."""
        self.batch.settle()
        self.runner.restart([])
        try:
            return self.runner.all_logits(ids)
        finally:
            self.runner.restart([])

    # -- accounting --------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Memory and KV cache figures; `devices`: each context's, in split order (one unsplit),
        with the layers it runs; the VRAM figures outside it are their sums."""
        devices = [{"device": stage.ctx.info.index, "name": stage.ctx.info.name,
                    "layers": [stage.layers.start, stage.layers.stop],
                    **dict(zip(("vram_used_bytes", "vram_total_bytes"), stage.ctx.memory_budget()))}
                   for stage in self.placement]
        kv = self.kv.stats()
        return {"vram_used_bytes": sum(d["vram_used_bytes"] for d in devices),
                "vram_total_bytes": sum(d["vram_total_bytes"] for d in devices), "devices": devices,
                "kv_cache_usage_ratio": kv["kv_blocks_used"] / kv["kv_blocks_total"], **kv,
                "sequences": len(self.batch)}

    def close(self):
        self.batch.settle()
        self.runner.close()
        self.model.free()
        self.kv.free()
        if self._owns_ctx:
            for stage in self.placement:
                stage.ctx.close()


def open_contexts(settings: Settings) -> list:
    """A context per entry of settings.devices (the same device may repeat, by index or name:
    several contexts on its one logical device), or the one of settings.device."""
    from dataclasses import replace

    from worker.engine.vk.context import Context
    from worker.engine.vk.device import choose_device, list_devices
    ctxs = []
    try:
        for device in settings.devices or (settings.device,):
            index = choose_device(list_devices(ctxs[0].instance), device)[0].index if ctxs else None
            share = next((ctx for ctx in ctxs if ctx.info.index == index), None)
            ctxs.append(Context(replace(settings, device=device), share=share))
    except BaseException:
        for ctx in ctxs:
            ctx.close()
        raise
    return ctxs


def _quant_name(model_file) -> str:
    """The most common type by bytes among 2-D weights, the way people name a GGUF's quant."""
    totals: dict[str, int] = {}
    for t in model_file.tensors.values():
        if len(t.shape) > 1:
            totals[t.ggml_type.name] = totals.get(t.ggml_type.name, 0) + t.n_bytes
    return max(totals, key=totals.get) if totals else "F32"


def _progress_bar(total: int, name: str):
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, desc=f"uploading {name}", file=sys.stderr,
                leave=False)

"""The models one worker keeps resident: loaded in order onto the same devices' contexts, which
they share (one logical device each, whose memory they split).

Each model keeps room for those after it (their weights, one context and a chunk's scratch, as
the memory plan counts them from their files, less the kernels' scratch, which needs the device)
and its KV pool takes its share of what is left, the last one all it may: otherwise the first
pool, which grows towards Settings.max_sequences contexts, would take the memory the next
model's weights need."""
from pathlib import Path

from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.engine.engine import DEFAULT_CONTEXT, Engine, open_contexts
from worker.engine.memplan import POOL_SHARE, MemoryPlan, human_bytes
from worker.engine.modelfile import ModelFile


class Resident:
    """The engines, in load order, and the contexts they share; close() frees them all."""

    def __init__(self, engines: list[Engine], contexts: list):
        self.engines, self.contexts = engines, contexts

    def close(self) -> None:
        for engine in self.engines:
            engine.close()
        for ctx in self.contexts:
            ctx.close()


def load_resident(paths: list, settings: Settings, n_ctx: int | None = None) -> Resident:
    """Every file is opened (and checked) before anything loads; when one fails to load, what was
    loaded is freed and the error raised."""
    files = [ModelFile.open(path) for path in paths]
    needs = [MemoryPlan.compute(f, f.config, min(n_ctx or DEFAULT_CONTEXT, f.config.context_length),
                                kv_type=settings.kv_type).total for f in files]
    resident = Resident([], open_contexts(settings))
    try:
        for i, (path, file) in enumerate(zip(paths, files)):
            reserve = sum(needs[i + 1:])
            try:
                engine = Engine.load(file, settings, n_ctx=n_ctx, ctx=resident.contexts, reserve=reserve,
                                     pool_share=POOL_SHARE / (len(paths) - i))
            except VkllmError as e:
                if not reserve:
                    raise
                later = ", ".join(Path(p).name for p in paths[i + 1:])
                raise VkllmError(f"{Path(path).name}: {e} ({human_bytes(reserve)} of the device's memory "
                                 f"is kept for the models loaded after it: {later})") from e
            resident.engines.append(engine)
    except BaseException:
        resident.close()
        raise
    return resident

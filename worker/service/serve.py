"""`vkllm worker`: the models loaded once, their metrics served, then a GPUWorker
(worker.service.worker) serving their queues until stopped."""
import gc
import logging
import os
import socket
import uuid
from pathlib import Path

from vkllm.errors import VkllmError
from worker.service.metrics import WorkerMetrics
from worker.service.redislink import connect, wait_for_redis
from worker.service.worker import GPUWorker

log = logging.getLogger(__name__)


def resolve_model(spec: str, models_dir: Path) -> Path:
    """A model is given as a path or as a file name (with or without .gguf) in the models folder."""
    candidates = (Path(spec), models_dir / spec, models_dir / f"{spec}.gguf")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates:
        if candidate.is_dir():
            raise VkllmError(f"model {spec!r}: {candidate} is a directory, not a GGUF file")
    raise VkllmError(f"model {spec!r} not found (as a path or in {models_dir})")


def load_models(specs: list[str], settings, n_ctx: int | None):
    """Every model loaded once, before serving (one that fails to load stops the worker); then
    all that is alive is moved out of the garbage collector's reach (gc.freeze): the models'
    tokenizers and recordings live as long as the worker, and a full collection that walked them
    would stall every running stream (SmolLM2 loaded: 43k objects, 14-21 ms a collection on
    lavapipe's machine, 0.03 ms frozen)."""
    from worker.engine.resident import load_resident
    resident = load_resident([resolve_model(spec, settings.models_dir) for spec in specs], settings, n_ctx)
    gc.freeze()
    return resident


def serve(args, settings) -> int:
    """`vkllm worker`: load the models, expose metrics, serve their queues until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    connection, link = connect(args.redis_url)
    resident = load_models(args.model, settings, args.n_ctx)
    engines = {engine.name: engine for engine in resident.engines}
    # host and pid are not unique enough: a container restarted keeps both (pid 1), and RQ refuses
    # a name whose last holder was killed (its record lingers for minutes)
    name = args.name or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    metrics = WorkerMetrics(name)
    for model, engine in engines.items():
        metrics.loaded(model, engine.stats())
        metrics.batch(model, engine.batch.stats())
    port = metrics.serve(args.metrics_port, args.metrics_host)
    log.info("worker %s serving %s; metrics on %s port %d", name, ", ".join(engines), args.metrics_host, port)
    wait_for_redis(link)
    worker = GPUWorker(engines, connection, link, metrics=metrics, metrics_port=port,
                       heartbeat_interval=args.heartbeat_interval)
    try:
        worker.work(burst=args.burst, logging_level="INFO")
    finally:
        resident.close()
    return 0

"""The worker's model loading (worker/service/worker.py's load_models): the loaded models are out
of the garbage collector's reach, so that a full collection does not walk them mid-stream."""
import gc

from worker.engine.config import Settings
from worker.service.worker import load_models


def tracked(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_loaded_models_are_frozen_out_of_the_collector(tiny_model):
    vocab = list(range(3))
    assert tracked(vocab)   # an object alive before the load is frozen with the models
    resident = load_models([str(tiny_model)], Settings.from_env(), 256)
    try:
        (engine,) = resident.engines
        assert gc.get_freeze_count() > 0
        assert not tracked(engine) and not tracked(engine.tokenizer) and not tracked(vocab)
        after = list(range(3))
        assert tracked(after)   # what the jobs allocate later is collected as before
    finally:
        gc.unfreeze()
        resident.close()

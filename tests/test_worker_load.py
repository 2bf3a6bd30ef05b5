"""The worker's model loading (worker/service/serve.py's resolve_model and load_models): a model
named by what it is, and the loaded models out of the garbage collector's reach, so that a full
collection does not walk them mid-stream."""
import gc

import pytest

from vkllm.errors import VkllmError
from worker.engine.config import Settings
from worker.service.serve import load_models, resolve_model


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


def test_a_directory_given_as_the_model_is_named_as_one(tmp_path):
    """-m with a folder, as a path or in the models folder, says it is a folder (it said 'not found')."""
    models_dir = tmp_path / "models"
    (models_dir / "qwen").mkdir(parents=True)
    with pytest.raises(VkllmError) as given:
        resolve_model(str(tmp_path), models_dir)
    assert str(given.value) == f"model {str(tmp_path)!r}: {tmp_path} is a directory, not a GGUF file"
    with pytest.raises(VkllmError) as named:
        resolve_model("qwen", models_dir)
    assert str(named.value) == f"model 'qwen': {models_dir / 'qwen'} is a directory, not a GGUF file"
    with pytest.raises(VkllmError) as missing:
        resolve_model("llama", models_dir)
    assert str(missing.value) == f"model 'llama' not found (as a path or in {models_dir})"

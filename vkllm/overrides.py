"""Metadata overrides kept beside a GGUF: `<stem>.override.json`, a JSON object of GGUF keys and
the values that replace the file's own (llama.cpp's --override-kv and --chat-template, made to
last; an Ollama Modelfile's PARAMETER and TEMPLATE lines play the same part). Only keys that
shape what a request gets are allowed: the recommended sampling values (general.sampling.*, as
vkllm.sampling_defaults reads them) and the chat template. The demo model ships one
(vkllm/demo.py). Standard library only: the engine applies them when it opens a model, the web
app's model list flags a file whose overrides the engine would refuse."""
import json
from pathlib import Path

from vkllm.errors import VkllmError
from vkllm.sampling_defaults import GGUF_KEYS

SUFFIX = ".override.json"
INTEGER_KEYS = frozenset({GGUF_KEYS["top_k"], GGUF_KEYS["repeat_last_n"]})
ALLOWED = frozenset(GGUF_KEYS.values()) | {"tokenizer.chat_template"}


def path_for(model_path: Path) -> Path:
    """Where the overrides of the GGUF at model_path live: beside it, named after it."""
    model_path = Path(model_path)
    return model_path.with_name(model_path.stem + SUFFIX)


def read(model_path: Path) -> dict:
    """The overrides of the GGUF at model_path ({} without a file); VkllmError naming the file
    and the key for anything else than a JSON object of allowed keys and well-typed values."""
    path = path_for(model_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise VkllmError(f"cannot read {path}: {e}") from None
    try:
        values = json.loads(text)
    except json.JSONDecodeError as e:
        raise VkllmError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(values, dict):
        raise VkllmError(f"{path} must hold a JSON object of GGUF keys and values")
    for key, value in values.items():
        if key not in ALLOWED:
            raise VkllmError(f"{path}: {key!r} cannot be overridden (allowed: {', '.join(sorted(ALLOWED))})")
        if not _well_typed(key, value):
            kind = "a string" if key == "tokenizer.chat_template" else \
                "an integer" if key in INTEGER_KEYS else "a number"
            raise VkllmError(f"{path}: {key} must be {kind}, not {json.dumps(value)}")
    return values


def _well_typed(key: str, value) -> bool:
    if key == "tokenizer.chat_template":
        return isinstance(value, str)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if key in INTEGER_KEYS else isinstance(value, int | float)

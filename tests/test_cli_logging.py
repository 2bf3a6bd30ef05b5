"""The `vkllm` command's logging (vkllm/cli.py's configure_logging), in a process of its own as
the console script runs: the engine's informational lines (a first load timing its kernels'
shapes) reach stderr, prefixed, and leave stdout to the command's own output."""
import re
import subprocess
import sys

SCRIPT = """
import logging
from vkllm.cli import configure_logging
configure_logging()
logging.getLogger("worker.engine.kernels.tuning").info("timing Q4_K 14336x4096: mat-vec workgroup shapes")
logging.getLogger("worker.engine.kernels.tuning").debug("not shown")
logging.getLogger("gguf.gguf_writer").info("This GGUF file is for Little Endian only")
logging.getLogger("gguf.gguf_writer").warning("a gguf warning")
print("table")
"""


def test_info_lines_go_to_stderr_with_the_commands_prefix():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "table\n"
    assert done.stderr == "vkllm: timing Q4_K 14336x4096: mat-vec workgroup shapes\nvkllm: a gguf warning\n"


def test_synth_shows_only_its_own_lines(tmp_path):
    """The gguf package's INFO lines as it writes ('This GGUF file is for Little Endian only',
    the files and their sizes) are not ours: stderr holds only the progress bar."""
    out = tmp_path / "tiny.gguf"
    done = subprocess.run([sys.executable, "-c", "import sys; from vkllm.cli import main; sys.exit(main())",
                           "models", "synth", "tiny-llama", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{out}\n"
    shown = [part for part in re.split(r"[\r\n]", done.stderr) if part]
    assert shown and all(part.startswith("tiny-llama: ") for part in shown), done.stderr

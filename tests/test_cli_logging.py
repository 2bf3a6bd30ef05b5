"""The `vkllm` command's logging (vkllm/cli.py's configure_logging), in a process of its own as
the console script runs: the engine's informational lines (a first load timing its kernels'
shapes) reach stderr, prefixed, and leave stdout to the command's own output."""
import subprocess
import sys

SCRIPT = """
import logging
from vkllm.cli import configure_logging
configure_logging()
logging.getLogger("worker.engine.kernels.tuning").info("timing Q4_K 14336x4096: mat-vec workgroup shapes")
logging.getLogger("worker.engine.kernels.tuning").debug("not shown")
print("table")
"""


def test_info_lines_go_to_stderr_with_the_commands_prefix():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "table\n"
    assert done.stderr == "vkllm: timing Q4_K 14336x4096: mat-vec workgroup shapes\n"

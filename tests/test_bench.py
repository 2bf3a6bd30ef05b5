"""`vkllm bench -m FILE` on the test device: one row of figures for the engine (also printed as
soon as measured, before the table), loaded with the
context asked (`--ctx`: decode attention's split count follows it, so a bench at a worker's
context times what the worker runs), and a context too small for the run refused."""
import contextlib
import io
import re

import pytest

from vkllm.cli import main


def test_bench_loads_the_context_asked(tiny_model):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "-m", str(tiny_model), "-p", "8", "-n", "4", "-r", "1", "--ctx", "300"]) == 0
    text = out.getvalue()
    assert re.search(r"; context 300$", text, re.M), text
    row = re.search(r"^tiny-llama\s+\S+\s+vkllm\s+(\S+)\s+(\S+)", text, re.M)
    assert row and float(row[1]) > 0 and float(row[2]) > 0, text
    # the same figures as soon as measured, before the table
    early = re.search(r"tiny-llama\.gguf: vkllm pp8 (\S+) tok/s, tg4 (\S+) tok/s$", text, re.M)
    assert early and text.index(early[0]) < text.index(row[0]) and (early[1], early[2]) == (row[1], row[2]), text


def test_bench_refuses_a_context_smaller_than_the_run(tiny_model, capsys):
    assert main(["bench", "-m", str(tiny_model), "-p", "8", "-n", "4", "--ctx", "10"]) != 0
    assert "--ctx 10 holds fewer positions than -p 8 and -n 4" in capsys.readouterr().err


def test_counts_below_one_are_usage_errors(tiny_model, capsys):
    """-n 0 divided by zero, -r 0 took the median of nothing, --batch 0 timed nothing: each is
    now refused by the parser, exit 2, its flag named, before the model is loaded."""
    for flags, named in ((["-n", "0"], "-n/--n-gen: not a whole number of at least 1: '0'"),
                         (["-r", "0"], "-r/--repetitions: not a whole number of at least 1: '0'"),
                         (["--batch", "8,0"], "--batch: not comma-separated whole numbers of at least 1: '8,0'")):
        with pytest.raises(SystemExit) as done:
            main(["bench", "-m", str(tiny_model), *flags])
        assert done.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1] == f"vkllm bench: error: argument {named}"


@pytest.mark.parametrize("argv, named", (
    (["bench", "kernels", "--quick", "--runs", "0"], "--runs: not a whole number of at least 1: '0'"),
    (["bench", "kernels", "--quick", "--prefill", "-3"], "--prefill: not a whole number of at least 0: '-3'"),
    (["bench", "kernels", "--quick", "--cols", "4,0"],
     "--cols: not comma-separated whole numbers of at least 1: '4,0'"),
    (["bench", "serve", "--engine", "x.gguf", "--prefix-tokens", "-5"],
     "--prefix-tokens: not a whole number of at least 0: '-5'"),
    (["bench", "serve", "--engine", "x.gguf", "--seed", "-5"], "--seed: not a whole number of at least 0: '-5'"),
))
def test_kernel_and_serve_flags_out_of_range_are_usage_errors(argv, named, capsys):
    """bench kernels --runs 0 took the median of nothing, --prefill -3 made a negative array,
    --cols 0 divided by zero; bench serve's negative --prefix-tokens or --seed failed in numpy:
    each a traceback after the device was opened. Now the parser refuses them, exit 2."""
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    command = " ".join(argv[:2])
    assert capsys.readouterr().err.splitlines()[-1] == f"vkllm {command}: error: argument {named}"

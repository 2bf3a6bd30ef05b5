"""`vkllm bench kernels` on lavapipe (--quick weights): with --cols every column count times each
kernel and the mat-cols products agree with the mat-vec kernel's on the same input; --shapes
times the weights asked; --glu times the fused gate+up three ways."""
import argparse
import re

import pytest
from gguf import GGMLQuantizationType

from worker.engine.weight_types import row_bytes
from worker.tools import bench_cols, bench_glu, bench_kernels


def test_bench_cols_times_each_kernel_and_checks_mat_cols(vk_ctx, capsys):
    parser = argparse.ArgumentParser()
    bench_kernels.add_arguments(parser)
    args = parser.parse_args(["--quick", "--cols", "1,3,17", "--runs", "1", "--types", "Q4_K", "Q6_K"])
    checks = bench_cols.run(vk_ctx, args, 1 << 20, 0.0, 1e9)
    assert set(checks) == {(name, t.name) for name, t, *_ in bench_cols.QUICK_WEIGHTS}
    for by_n in checks.values():
        assert set(by_n) == {3, 17} and max(by_n.values()) < 1e-5
    out = capsys.readouterr().out
    assert out.count("\n") == 1 + 3 * len(bench_cols.QUICK_WEIGHTS) + 1
    assert "one 8B pass" in out and "mat_cols n=1" in out
    rows = [line.split() for line in out.splitlines()[1:-1]]
    # the 8-bit mat-cols kernel's column (lavapipe has integer dot products): every weight here
    # is Q4_K or Q6_K, timed at 3 and 17 columns
    assert [row[8] != "-" for row in rows] == [n != "1" for _, _, _, n, *_ in rows]


def test_bench_kernels_times_the_shapes_asked(capsys):
    """`--shapes`: one line per type and rows x K given, in order, instead of the 8B's."""
    parser = argparse.ArgumentParser()
    bench_kernels.add_arguments(parser)
    args = parser.parse_args(["--quick", "--shapes", "40x256,24x512", "--runs", "1", "--types", "Q4_K", "Q8_0"])
    bench_kernels.run(args)
    lines = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(row[0], row[1]) for row in lines] == [("Q4_K", "40x256"), ("Q4_K", "24x512"),
                                                  ("Q8_0", "40x256"), ("Q8_0", "24x512")]
    for bad in ("40x", "40x256x2", "0x256", "axb"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--shapes", bad])


def test_bench_kernels_glu_times_the_fused_gate_up_three_ways(x8_ctx, capsys):
    """`--glu`: per type and gate shape, the fused kernel with and without its 8-bit blocks (those
    only where decode writes them: over 8-bit x, rows of whole 32-row blocks) and the stacked
    product, each with the tuner's best shape, over the bytes of both weights."""
    parser = argparse.ArgumentParser()
    bench_kernels.add_arguments(parser)
    args = parser.parse_args(["--quick", "--glu", "--shapes", "64x512,40x256", "--types", "Q4_K", "F16"])
    bench_glu.run(x8_ctx, args, 1e9)
    lines = capsys.readouterr().out.splitlines()[1:]
    assert [tuple(line.split()[:2]) for line in lines] == [("Q4_K", "64x512"), ("Q4_K", "40x256"),
                                                          ("F16", "64x512"), ("F16", "40x256")]
    for line in lines:
        name, shape, mb = line.split()[:3]
        rows, k = map(int, shape.split("x"))
        assert float(mb) == pytest.approx(2 * rows * row_bytes(GGMLQuantizationType[name], k) / 1e6, abs=0.05)
        cells = re.findall(r"(\S+) +([\d.]+) us +([\d.]+)%", line)
        with_blocks = name == "Q4_K" and rows % 32 == 0   # Q4_K over 8-bit x there, F16 over f32
        assert len(cells) == 2 + with_blocks and (line.split()[3] == "-") != with_blocks
        assert all(float(us) > 0 and float(share) > 0 for _, us, share in cells)

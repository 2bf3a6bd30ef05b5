"""`vkllm bench kernels` on lavapipe (--quick weights): with --cols every column count times each
kernel and the mat-cols products agree with the mat-vec kernel's on the same input; --shapes
times the weights asked."""
import argparse

import pytest

from worker.tools import bench_cols, bench_kernels


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

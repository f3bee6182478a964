"""``tools/roofline.py`` walks the offline workload step by step; at the H200's nominal 4.8 TB/s and
989 TFLOP/s its bandwidth bound must be the one BENCHMARKS.md measures against (the shared device
README's ≈ 40.8k for Qwen3-0.6B and ≈ 15.7k for Llama-3.1-8B), and the roofline, which can only
add time, must not exceed it."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "roofline.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("roofline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shape, bound", [("qwen3-0.6b", 40_800), ("llama-3.1-8b", 15_700)])
def test_the_walk_reproduces_the_bounds_we_measure_against(shape, bound):
    row = load_tool().bounds(shape, 4.8e12, 989e12)
    assert abs(row["bandwidth_bound_tok_s"] - bound) / bound < 0.005, row
    assert row["roofline_tok_s"] <= row["bandwidth_bound_tok_s"]
    assert row["decode_steps"] == 1023  # the longest request: 1,024 tokens, the first from prefill


def test_a_mixture_of_experts_step_reads_the_experts_its_batch_chose():
    """Qwen3-30B-A3B: at a batch of 256 a decode step reads nearly every expert (a bound below
    Llama-3.1-8B's though fewer parameters are active a token); with only one request it would
    read 8 of 128 a layer, so the bound rises steeply as the batch shrinks."""
    tool = load_tool()
    row = tool.bounds("qwen3-30b-a3b", 4.8e12, 989e12)
    assert (
        row["roofline_tok_s"]
        <= row["bandwidth_bound_tok_s"]
        < tool.bounds("llama-3.1-8b", 4.8e12, 989e12)["bandwidth_bound_tok_s"]
    )
    # 1,023 decode steps that read every expert (58.0 GB) and the rest (2.4 GB) would take 12.9 s;
    # the run's tail, of few requests, reads fewer experts
    assert 11.0 < row["seconds"]["decode_gemm_bytes"] < 12.8


def test_e4m3_weights_halve_every_decode_read_but_the_lm_head():
    """``--weight-bytes 1`` (``--quantization fp8``): the decode GEMMs' bytes are half of bf16's
    less half of the lm_head's (which stays bf16); prefill and attention are unchanged."""
    tool = load_tool()
    for shape in ("llama-3.1-8b", "qwen3-30b-a3b"):
        bf16 = tool.bounds(shape, 4.8e12, 989e12)["seconds"]
        fp8 = tool.bounds(shape, 4.8e12, 989e12, weight_bytes=1)["seconds"]
        config = tool.SHAPES[shape]
        head_s = 1023 * config["vocab_size"] * config["hidden_size"] * 2 / 4.8e12  # every decode step
        assert fp8["decode_gemm_bytes"] == pytest.approx(bf16["decode_gemm_bytes"] / 2 + head_s / 2, rel=1e-3)
        assert (fp8["prefill"], fp8["decode_attention"]) == (bf16["prefill"], bf16["decode_attention"])


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "many"])
def test_a_rate_that_is_not_positive_and_finite_is_a_usage_error(bad, capsys):
    """``--bandwidth 0`` was a ZeroDivisionError and ``nan`` or ``-1`` printed nonsense bounds."""
    tool = load_tool()
    for flag in ("--bandwidth", "--flops"):
        with pytest.raises(SystemExit) as exit_info:
            tool.main_with([flag, bad])
        assert exit_info.value.code == 2
        assert f"argument {flag}: invalid positive finite number value: '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "bad", "says"),
    [
        ("--bandwidth", "1e-300", "1e-300 bytes/s is outside 1e+09 to 1e+15: give the device's rate in bytes/s, e.g. 4.8e12 for 4.8 TB/s"),
        ("--bandwidth", "4.8", "4.8 bytes/s is outside 1e+09 to 1e+15"),
        ("--bandwidth", "1e300", "1e300 bytes/s is outside 1e+09 to 1e+15"),
        ("--flops", "1e-300", "1e-300 FLOP/s is outside 1e+09 to 1e+18: give the device's rate in FLOP/s, e.g. 989e12 for 989 TFLOP/s"),
        ("--flops", "1e30", "1e30 FLOP/s is outside 1e+09 to 1e+18"),
    ],
)  # fmt: skip
def test_a_rate_no_device_has_is_a_usage_error(flag, bad, says, capsys):
    """``--bandwidth 1e-300`` printed inf seconds and 0 tok/s, ``1e300`` a 300-digit TB/s column,
    and ``4.8`` (TB/s meant) bounds of hours: a usage error now, naming the unit and the range."""
    tool = load_tool()
    with pytest.raises(SystemExit) as exit_info:
        tool.main_with([flag, bad])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == ""
    last = captured.err.splitlines()[-1]
    assert last.startswith(f"roofline.py: error: argument {flag}: {says}"), last


def test_the_ends_of_the_rates_taken_give_finite_bounds(capsys):
    tool = load_tool()
    (low_bandwidth, high_bandwidth), (low_flops, high_flops) = tool.BANDWIDTH_RANGE, tool.FLOPS_RANGE
    for bandwidth, flops in ((low_bandwidth, high_flops), (high_bandwidth, low_flops)):
        tool.main_with(["--bandwidth", f"{bandwidth:g}", "--flops", f"{flops:g}", "--json"])
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert rows and all(all(map(math.isfinite, row["seconds"].values())) for row in rows)


def test_rates_pair_up_and_none_is_dropped(capsys):
    """Three --bandwidth values print three rows (the third was dropped by a zip with the two
    default FLOP/s); one value goes with every one of the other kind; unequal lists are refused."""
    tool = load_tool()
    parser = tool.argparse.ArgumentParser()
    assert tool.rates_of(parser, None, None) == [(4.8e12, 989e12), (4.25e12, 789e12)]
    assert tool.rates_of(parser, [1e12], None) == [(1e12, 989e12)]  # BENCHMARKS.md's H100 rows
    assert tool.rates_of(parser, [1e12, 2e12], None) == [(1e12, 989e12), (2e12, 789e12)]
    assert tool.rates_of(parser, [1e12, 2e12, 3e12], None) == [(b, 989e12) for b in (1e12, 2e12, 3e12)]
    assert tool.rates_of(parser, None, [5e14]) == [(4.8e12, 5e14)]
    assert tool.rates_of(parser, [1e12], [1e14, 2e14, 3e14]) == [(1e12, f) for f in (1e14, 2e14, 3e14)]
    with pytest.raises(SystemExit):
        tool.rates_of(parser, [1e12, 2e12], [1e14, 2e14, 3e14])
    assert "2 --bandwidth and 3 --flops values" in capsys.readouterr().err
    tool.main_with(["--bandwidth", "1e12", "--bandwidth", "2e12", "--bandwidth", "3e12"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("qwen3-0.6b ")]
    assert [line.split()[1] for line in rows] == ["1.00", "2.00", "3.00"]


def test_element_sizes_other_than_one_or_two_bytes_are_refused(capsys):
    tool = load_tool()
    for flag in ("--kv-bytes", "--weight-bytes"):
        with pytest.raises(SystemExit):
            tool.main_with([flag, "0"])
        assert "invalid choice: 0 (choose from 1, 2)" in capsys.readouterr().err

"""``tools/trace_steps.py`` on a small synthetic Chrome trace: steps cut after the marker kernel,
per-kernel time and idle per step, a PDL kernel's overlap counted as negative idle, CPU events
left out."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_tool():
    spec = importlib.util.spec_from_file_location("trace_steps", ROOT / "tools" / "trace_steps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trace(path: Path, steps: int) -> None:
    """Each step, 100 µs apart: gemv 10 µs at +0, norm 2 µs at +11 (1 µs idle), attention 3 µs at
    +12 (starts 1 µs before norm ends), argmax 1 µs at +20 (5 µs idle); one CPU op a step."""
    events = []
    for i in range(steps):
        t = 1000.0 + 100.0 * i
        for name, start, dur in (("gemv", 0, 10), ("norm", 11, 2), ("attention", 12, 3), ("argmax_k", 20, 1)):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t + start, "dur": dur})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": t + 1, "dur": 50})
    events.reverse()  # the tool orders them by start
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_per_kernel_time_and_idle_per_step(tmp_path):
    tool = load_tool()
    path = tmp_path / "t.json.gz"
    _trace(path, 8)
    steps = tool.split_steps(tool.load_events(str(path)), "argmax")
    assert len(steps) == 8 and [e["name"] for e in steps[0]] == ["gemv", "norm", "attention", "argmax_k"]
    s = tool.summarize(steps, skip=2, count=4)
    assert s["steps"] == 4 and s["period_us"] == pytest.approx(100.0)
    k = s["kernels"]
    assert list(k) == ["gemv", "attention", "norm", "argmax_k"]  # by device time
    assert k["gemv"] == {"calls": 1.0, "us": 10.0, "idle_before_us": 0.0}
    assert k["norm"]["idle_before_us"] == pytest.approx(1.0)
    assert k["attention"]["idle_before_us"] == pytest.approx(-1.0)
    assert k["argmax_k"]["idle_before_us"] == pytest.approx(5.0)


def test_too_few_steps_is_an_error(tmp_path):
    tool = load_tool()
    path = tmp_path / "t.json.gz"
    _trace(path, 3)
    steps = tool.split_steps(tool.load_events(str(path)), "argmax")
    with pytest.raises(ValueError, match="not enough"):
        tool.summarize(steps, skip=2, count=4)

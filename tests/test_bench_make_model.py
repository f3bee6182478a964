"""`minisgl bench make-model` checks where it would draw the weights before it writes anything."""

from __future__ import annotations

import pytest
import torch

from minisgl_core.bench.shapes import build_random_model
from minisgl_core.testing.cli_runner import run_cli


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("nope", "--device must be cpu, cuda or cuda:N; got 'nope'"),
        ("meta", "--device must be cpu, cuda or cuda:N; got 'meta'"),
        *([] if torch.cuda.is_available() else
          [("cuda", "--device cuda was asked for but CUDA is not available here; use --device cpu")]),
    ],
)  # fmt: skip
def test_a_device_it_cannot_use_is_one_line_and_nothing_is_written(tmp_path, device, says):
    """It was torch's traceback, after the missing folders and the tokenizer files were written."""
    out = tmp_path / "deep" / "model"
    proc = run_cli(["bench", "make-model", "--shape", "qwen3-0.6b", "--out", str(out), "--device", device])
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [f"minisgl: error: {says}"]
    assert list(tmp_path.iterdir()) == []


def test_build_random_model_on_a_bad_device_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        build_random_model("qwen3-0.6b", tmp_path / "deep" / "model", device="nope")
    assert list(tmp_path.iterdir()) == []

"""A checkpoint tensor of an integer or bool dtype where the model holds floats (an int32
q_proj.weight, an int64 norm of the right shape) is one error naming the tensor and its dtype:
the launcher read past it (its shape check skips non-float dtypes) and the loader cast the values
to floats, another model without a word. Float checkpoints of any precision stay accepted: the
quantization methods quantize them at load, whatever the run dtype."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from minisgl_core import LLM
from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.config import EngineConfig
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import Plugins
from minisgl_core.testing.cli_runner import run_cli

Q_PROJ = "model.layers.0.self_attn.q_proj.weight"
NORM = "model.layers.1.input_layernorm.weight"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


def _with_tensor_as(model_dir: Path, out: Path, name: str, dtype: torch.dtype) -> Path:
    shutil.copytree(model_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors[name] = (tensors[name] * 100).round().to(dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize(
    ("name", "dtype", "shown"),
    [
        (Q_PROJ, torch.int32, "I32"),
        (NORM, torch.int64, "I64"),
        (Q_PROJ, torch.uint8, "U8"),
        (NORM, torch.bool, "BOOL"),
    ],
    ids=["q_proj-int32", "norm-int64", "q_proj-uint8", "norm-bool"],
)
def test_llm_names_the_tensor_and_its_dtype(model_dir, tmp_path, name, dtype, shown):
    bad = _with_tensor_as(model_dir, tmp_path / "bad", name, dtype)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: weight {name} in model.safetensors has dtype {shown}; the model holds it as "
        "floating point (F32, F16, BF16...): integer and bool weights are not cast"
    )


def test_the_command_line_says_it_in_one_line(model_dir, tmp_path):
    bad = _with_tensor_as(model_dir, tmp_path / "bad", Q_PROJ, torch.int32)
    proc = run_cli(["generate", "--model", bad, "--device", "cpu", "--max-tokens", "3", "hi"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: --model {bad}: weight {Q_PROJ} in model.safetensors has dtype I32; the model holds "
        "it as floating point (F32, F16, BF16...): integer and bool weights are not cast"
    ]


def test_the_loader_refuses_it_when_the_launcher_did_not_check(model_dir, tmp_path):
    bad = _with_tensor_as(model_dir, tmp_path / "bad", NORM, torch.int64)
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert str(err.value).startswith(
        f"--model {bad}: weight {NORM}: dtype int64 for a floating-point parameter: integer and bool "
        "tensors are not cast to floats"
    )


def test_a_float16_checkpoint_still_loads_in_float32_and_quantized(tmp_path):
    half = make_model_dir(tmp_path / "half", "LlamaForCausalLM", dtype="float16")
    params = {"max_tokens": 2, "temperature": 0.0}
    for quantization in (None, "int8"):
        with LLM(half, attn="torch", device="cpu", dtype="float32", quantization=quantization) as llm:
            assert len(llm.generate([[5, 6, 7]], llm.sampling_params(**params))[0].token_ids) == 2

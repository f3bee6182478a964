"""A checkpoint holding a NaN or an infinity is refused naming the weight: it loaded without a
word and every request then ended at once with empty text (NaN logits sample token 0), at any
temperature. Found by a loading probe."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from minisgl_core import LLM, SamplingParams
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing.cli_runner import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


def _with_value(model_dir: Path, out: Path, name: str, value: float) -> Path:
    shutil.copytree(model_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[3] = value
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.mark.parametrize(
    ("name", "value", "loaded_as"),
    [
        ("model.layers.0.self_attn.q_proj.weight", float("nan"), "model.layers.0.self_attn.qkv_proj.weight"),
        ("model.norm.weight", float("inf"), "model.norm.weight"),
        ("model.embed_tokens.weight", float("-inf"), "model.embed_tokens.weight"),
    ],
    ids=["nan-q_proj", "inf-norm", "minus-inf-embedding"],
)
def test_a_non_finite_weight_is_named(model_dir, tmp_path, name, value, loaded_as):
    bad = _with_value(model_dir, tmp_path / "bad", name, value)
    with pytest.raises(ModelPathError, match=rf"weight {loaded_as} holds NaN or infinite values"):
        LLM(bad, attn="torch", device="cpu")


def test_the_command_line_says_it_in_one_line(model_dir, tmp_path):
    bad = _with_value(model_dir, tmp_path / "bad", "model.norm.weight", float("nan"))
    proc = run_cli(["generate", "--model", bad, "--device", "cpu", "--max-tokens", "3", "hi"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # (found once the weights are in: the loading bar is above it)
    assert proc.stderr.splitlines()[-1] == (
        f"minisgl: error: --model {bad}: weight model.norm.weight holds NaN or infinite values: "
        "the checkpoint is corrupt"
    )


def test_a_finite_checkpoint_loads_and_generates(model_dir):
    llm = LLM(model_dir, attn="torch", device="cpu")
    try:
        [out] = llm.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        assert len(out.token_ids) == 3
    finally:
        llm.close()


def test_a_value_past_float16s_range_is_not_called_corruption_under_float16(model_dir, tmp_path):
    """1e6 is finite in the file (it runs under float32 and bfloat16), infinite once cast to
    float16: "the checkpoint is corrupt" sent the user after a good file."""
    big = _with_value(model_dir, tmp_path / "big", "model.norm.weight", 1e6)
    with pytest.raises(ModelPathError) as err:
        LLM(big, attn="torch", device="cpu", dtype="float16")
    assert str(err.value).endswith(
        "weight model.norm.weight holds NaN or infinite values: past float16's range (±65504) once "
        "cast to it, or the checkpoint is corrupt; try dtype='bfloat16'"
    ), str(err.value)
    LLM(big, attn="torch", device="cpu", dtype="float32").close()

"""A config.json value no model can be built from (architectures not a list, a size that is not a
positive integer...) is one error naming config.json and the field, from the launcher's check, from
the runner (Engine() alone, or a weight format the launcher does not read) and on the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl_core import LLM
from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.config import EngineConfig
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import Plugins


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM")


def _with_config(model_dir: Path, tmp_path: Path, **changes: object) -> Path:
    out = tmp_path / "edited"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text()) | changes
    (out / "config.json").write_text(json.dumps(config))
    return out


ARCHITECTURES_SAYS = 'config.json: architectures must be a list of names, e.g. ["LlamaForCausalLM"], got '


@pytest.mark.parametrize("value", ["Qwen3ForCausalLM", {"name": "Qwen3ForCausalLM"}, ["Qwen3ForCausalLM", 3]])
def test_architectures_not_a_list_of_names_is_refused_naming_the_field(model_dir, tmp_path, value):
    """A string was indexed: "unknown model architecture 'Q'". transformers declares list[str] and
    its own code reads architectures[0] too, so a string is refused, not taken as one name."""
    bad = _with_config(model_dir, tmp_path, architectures=value)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"--model {bad}: {ARCHITECTURES_SAYS}{json.dumps(value)}"


def test_the_runner_refuses_architectures_not_a_list_when_the_launcher_did_not_check(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path, architectures="Qwen3ForCausalLM")
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert str(err.value) == f'--model {bad}: {ARCHITECTURES_SAYS}"Qwen3ForCausalLM"'


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "minisgl_core", *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_architectures_as_a_string_is_one_line_on_the_command_line(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path, architectures="Qwen3ForCausalLM")
    proc = _cli("serve", "--port", "0", "--model", str(bad), "--device", "cpu")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f'minisgl: error: --model {bad}: {ARCHITECTURES_SAYS}"Qwen3ForCausalLM"'
    ]

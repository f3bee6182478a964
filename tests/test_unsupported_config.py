"""A config.json setting the shared decoder cannot build (a rope type other than default/llama3,
hidden_act other than silu, a sliding window of no tokens, a partial rotary factor) is the launcher's one-line
error naming the setting and its value, before any process starts: it was a NotImplementedError
traceback from `minisgl generate`, a bare NotImplementedError from LLM() and a scheduler process's
crash under `minisgl serve`. The limits are the decoder's (``DecoderForCausalLM.unsupported_setting``),
not every model's: a plugin's model that builds more says so, and one that refuses in its
constructor is one line from the model runner too."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from minisgl_core import LLM
from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.checkpoint.resolve import check_model
from minisgl_core.config import EngineConfig
from minisgl_core.engine.engine import Engine
from minisgl_core.layers.decoder import DecoderForCausalLM
from minisgl_core.plugins import Plugins
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.cli_runner import run_cli

YARN = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 512}

#: (config.json changes, what the error says after "cannot be built from this model's config: ")
UNSUPPORTED = {
    "rope-yarn": (
        {"rope_parameters": YARN},
        "rope_parameters: rope type 'yarn' is not supported",
    ),
    "rope_scaling-dynamic": (
        {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "rope_scaling: rope type 'dynamic' is not supported",
    ),
    "hidden_act-gelu": ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (silu is)"),
    "use_sliding_window": (
        {"use_sliding_window": True, "sliding_window": 0},
        "use_sliding_window true (sliding_window 0) is not supported: the window must be a positive number",
    ),
    "partial_rotary_factor": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
        "rope_parameters.partial_rotary_factor 0.5 is not supported",
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


def _with_config(model_dir: Path, out: Path, **changes: object) -> Path:
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text()) | changes
    if "rope_scaling" in changes:  # an older config: transformers 5's rope_parameters comes first
        config.pop("rope_parameters", None)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(("changes", "says"), UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_generate_says_it_in_one_line(model_dir, tmp_path, changes, says):
    bad = _with_config(model_dir, tmp_path / "bad", **changes)
    proc = run_cli(["generate", "--model", bad, "--device", "cpu", "--max-tokens", "3", "hi"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        f"minisgl: error: --model {bad}: LlamaForCausalLM cannot be built from this model's config: {says}"
    ), lines[0]


@pytest.mark.parametrize(("changes", "says"), UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_llm_raises_a_model_path_error_before_loading_weights(model_dir, tmp_path, changes, says):
    bad = _with_config(model_dir, tmp_path / "bad", **changes)
    start = time.monotonic()
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert time.monotonic() - start < 30
    assert str(err.value).startswith(
        f"model={str(bad)!r}: LlamaForCausalLM cannot be built from this model's config: {says}"
    )


def test_the_launcher_check_refuses_before_any_process_starts(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path / "bad", rope_scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ModelPathError, match="rope_scaling: rope type 'longrope' is not supported"):
        check_model(str(bad), Plugins.load())


def test_a_supported_rope_still_loads(model_dir, tmp_path):
    llama3 = {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }  # fmt: skip
    good = _with_config(model_dir, tmp_path / "good", rope_scaling=llama3, hidden_act="silu")
    assert DecoderForCausalLM.unsupported_setting(json.loads((good / "config.json").read_text())) is None
    check_model(str(good), Plugins.load())
    with LLM(good, attn="torch", device="cpu", num_kv_tokens=256) as llm:
        assert (
            len(llm.generate([[5, 6, 7]], llm.sampling_params(max_tokens=2, temperature=0.0))[0].token_ids)
            == 2
        )


def test_the_runner_says_it_when_the_launcher_did_not_check(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path / "bad", hidden_act="gelu")
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert str(err.value).startswith(
        f"--model {bad}: LlamaForCausalLM cannot be built from this model's config: "
    )


PLUGIN = """
from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_models(register):
    register("YarnLlamaForCausalLM", "minisgl_yarnish_model:YarnLlamaForCausalLM")
"""
MODEL = """
from minisgl_core.layers import DecoderForCausalLM


class YarnLlamaForCausalLM(DecoderForCausalLM):
    @classmethod
    def unsupported_setting(cls, hf):
        return None  # (it would build yarn itself)

    def __init__(self, config):
        raise NotImplementedError("yarn needs minisgl-yarn 2, this is 1")
"""


def test_a_plugin_model_keeps_its_own_rules_and_its_refusal_is_one_line(
    model_dir, tmp_path, install_plugin_module
):
    install_plugin_module("minisgl_yarnish", "minisgl-yarnish", PLUGIN)
    (tmp_path / "minisgl_yarnish_model.py").write_text(MODEL)  # (next to the plugin's module)
    model = _with_config(
        model_dir, tmp_path / "yarn", architectures=["YarnLlamaForCausalLM"], rope_parameters=YARN
    )
    check_model(str(model), Plugins.load())  # the decoder's limits are not this model's
    with pytest.raises(ModelPathError) as err:
        LLM(model, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(model)!r}: YarnLlamaForCausalLM cannot be built from this model's config: "
        "yarn needs minisgl-yarn 2, this is 1"
    )


def test_a_gguf_model_is_asked_through_its_format_s_config(model_dir, tmp_path, monkeypatch):
    """GGUF models have no config.json: the launcher asks the config their format reads
    (``open_model(path).hf_config()``), here given a rope the decoder cannot build."""
    gguf_format = pytest.importorskip("minisgl_plugin_gguf.format")
    from minisgl_plugin_gguf.writer import write_gguf

    file = write_gguf(model_dir, tmp_path / "llama.gguf")
    check_model(str(file), Plugins.load())  # as written: a rope the decoder builds
    read = gguf_format.GGUFFormat.hf_config
    monkeypatch.setattr(
        gguf_format.GGUFFormat, "hf_config", lambda self: {**read(self), "rope_scaling": YARN}
    )
    with pytest.raises(ModelPathError) as err:
        check_model(str(file), Plugins.load())
    assert str(err.value).startswith(
        f"--model {file}: LlamaForCausalLM cannot be built from this model's config: "
        "rope_scaling: rope type 'yarn' is not supported"
    )

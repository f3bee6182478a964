"""A damaged model directory (weights cut short, a broken tokenizer, a config.json that does not
describe the weights) is one error naming the file, from ``LLM()`` and the command line, found
before any process starts; what only loading finds reaches the launcher as one line too."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from minisgl_core import LLM
from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.formats import load_tokenizer_dir
from minisgl_core.checkpoint.generation_defaults import GenerationConfigError, load_sampling_defaults
from minisgl_core.checkpoint.path_check import ModelPathError, check_model_path
from minisgl_core.config import EngineConfig
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import Plugins
from minisgl_core.testing.cli_runner import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM", num_shards=2)


def _copy(model_dir: Path, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(model_dir, out)
    return out


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _edit_config(model_dir: Path, **changes: object) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (model_dir / "config.json").write_text(json.dumps(config))


def _broken(model_dir: Path, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """One of each kind: name -> (directory, what its error must say)."""
    truncated = _copy(model_dir, tmp_path, "truncated")
    _truncate(truncated / "model.safetensors")
    tokenizer = _copy(model_dir, tmp_path, "tokenizer")
    (tokenizer / "tokenizer.json").write_text("this is not a tokenizer {")
    config = _copy(model_dir, tmp_path, "config")
    _edit_config(config, hidden_size=96)
    return {
        "truncated": (truncated, "model.safetensors is truncated or corrupt: the header needs "),
        "tokenizer": (tokenizer, f"tokenizer files in {tokenizer} could not be loaded: tokenizer.json: "),
        "config": (config, "has shape [1024, 64], config.json implies [1024, 96] (vocab_size, hidden_size)"),
    }


def test_each_kind_is_one_clear_error_offline(model_dir, tmp_path):
    for path, says in _broken(model_dir, tmp_path).values():
        with pytest.raises(ModelPathError) as err:
            LLM(path, attn="torch", device="cpu")
        message = str(err.value)
        assert message.startswith(f"model={str(path)!r}: ") and says in message and "\n" not in message, (
            message
        )


def test_a_truncated_shard_is_named(sharded_dir, tmp_path):
    bad = _copy(sharded_dir, tmp_path, "sharded")
    shard = sorted(bad.glob("model-*.safetensors"))[-1]
    _truncate(shard)
    with pytest.raises(ModelPathError, match=f"{shard.name} is truncated or corrupt: .* past its end"):
        LLM(bad, attn="torch", device="cpu")


def test_a_file_one_byte_short_names_its_last_tensor(model_dir, tmp_path):
    bad = _copy(model_dir, tmp_path, "one-byte-short")
    weights = bad / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1)
    with pytest.raises(ModelPathError, match=r"the file has [\d,]+ \(model\.[\w.]+ lies past its end"):
        LLM(bad, attn="torch", device="cpu")


def test_bytes_past_the_last_tensor_are_corrupt_as_safetensors_says(model_dir, tmp_path):
    bad = _copy(model_dir, tmp_path, "longer")
    with open(bad / "model.safetensors", "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(ModelPathError, match="model.safetensors is truncated or corrupt: 10 bytes follow"):
        LLM(bad, attn="torch", device="cpu")


def test_missing_tokenizer_files_are_named(model_dir, tmp_path):
    bad = _copy(model_dir, tmp_path, "no-tokenizer")
    (bad / "tokenizer.json").unlink()
    with pytest.raises(ModelPathError, match=f"no tokenizer in {bad} \\(expected tokenizer.json"):
        LLM(bad, attn="torch", device="cpu")


def test_a_tokenizer_config_that_is_no_json_object_is_named(model_dir, tmp_path):
    # (a list was transformers' "'list' object has no attribute 'get'", once the weights had loaded)
    bad = _copy(model_dir, tmp_path, "listed")
    (bad / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: tokenizer files in {bad} could not be loaded: tokenizer_config.json must "
        "hold a JSON object, got list"
    )


@pytest.mark.parametrize("value", ["512", [512], {"max": 512}], ids=json.dumps)
def test_a_model_max_length_that_is_no_number_is_named(model_dir, tmp_path, value):
    """A probe's find: transformers loads tokenizer_config.json's model_max_length as it is and
    compares it with every text prompt's length: the model loaded, then each text prompt was a
    TypeError ("'>' not supported between instances of 'int' and 'str')."""
    bad = _copy(model_dir, tmp_path, "max-length")
    config = json.loads((bad / "tokenizer_config.json").read_text())
    (bad / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": value}))
    says = (
        f"tokenizer files in {bad} could not be loaded: tokenizer_config.json: model_max_length must be a "
        f"number (the longest input, in tokens), got {json.dumps(value)}; fix it, or remove the key"
    )
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: {says}"
    with pytest.raises(ModelPathError) as err:  # the workers' load, where the launcher did not check
        load_tokenizer_dir(bad)
    assert str(err.value) == says


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (dict(vocab_size=2048), "has shape [1024, 64], config.json implies [2048, 64] (vocab_size, hidden_size)"),
        (dict(intermediate_size=96), "weight model.layers.0.mlp.down_proj.weight in model.safetensors has "
                                     "shape [64, 128], config.json implies [64, 96]"),
        (dict(num_key_value_heads=4), "weight model.layers.0.self_attn.k_proj.weight in model.safetensors "
                                      "has shape [32, 64], config.json implies [64, 64]"),
        (dict(num_hidden_layers=3), "num_hidden_layers 3, the weights have no model.layers.2.*"),
        (dict(num_hidden_layers=1), "num_hidden_layers 1, the weights also hold model.layers.1.*"),
        # the check built set(range(num_hidden_layers)) to find the first layer missing: a MemoryError
        (dict(num_hidden_layers=3_000_000_000), "num_hidden_layers 3000000000, the weights have no model.layers.2.* "
                                                 "(they hold 2 layers)"),
    ],
)  # fmt: skip
def test_a_config_that_does_not_describe_the_weights_names_a_tensor(model_dir, tmp_path, changes, says):
    bad = _copy(model_dir, tmp_path, "config")
    _edit_config(bad, **changes)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert says in str(err.value), str(err.value)


def test_a_stray_gguf_beside_the_safetensors_does_not_skip_their_checks(tmp_path):
    # the directory loads as safetensors (config.json decides, as in open_model); the .gguf skipped
    # every check, and a Llama config.json counting one layer of two loaded a truncated model
    bad = make_model_dir(tmp_path / "stray", "LlamaForCausalLM")
    (bad / "stray.gguf").write_bytes(b"GGUF")
    _edit_config(bad, num_hidden_layers=1)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: config.json says num_hidden_layers 1, the weights also hold model.layers.1.* "
        "(2 layers in all): config.json does not describe these weights"
    )
    # its generation_config.json too (one that is not JSON was read as none)
    (bad / "generation_config.json").write_text("{not json")
    with pytest.raises(
        GenerationConfigError, match="generation_config.json is not JSON .*; fix it, or remove it"
    ):
        load_sampling_defaults(bad)
    (bad / "model.safetensors").unlink()
    with pytest.raises(ModelPathError) as err:
        check_model_path(bad)
    assert str(err.value) == (
        f"--model {bad}: no weights in the directory (expected model.safetensors or "
        "model.safetensors.index.json); to load stray.gguf, pass the file itself"
    )
    (bad / "config.json").unlink()
    check_model_path(bad)  # a directory of one .gguf (and tokenizer files) is the GGUF format's


def test_the_loader_names_the_file_or_tensor_when_the_launcher_did_not_check(model_dir, tmp_path):
    """Engine() alone (a scheduler rank: the launcher checked, then the files changed, or a model
    the header check does not know): the same kind of error, not the library's words."""
    broken = _broken(model_dir, tmp_path)
    plugins = Plugins.load()
    says = {
        "truncated": f"{broken['truncated'][0]}: model.safetensors is truncated or corrupt",
        "tokenizer": f"tokenizer files in {broken['tokenizer'][0]} could not be loaded: ",
        "config": "weight lm_head.weight: checkpoint tensor of shape (1024, 64) does not fit a vocabulary "
        "of 1024 x 96 (config.json does not describe these weights?)",
    }
    for name, (path, _) in broken.items():
        with pytest.raises(ModelPathError) as err:
            Engine(EngineConfig(model=str(path), attn="torch", device="cpu"), ParallelContext(), plugins)
        assert says[name] in str(err.value), str(err.value)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_cli(args, env=env)


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_each_kind_is_one_line_on_the_command_line(model_dir, tmp_path, command):
    """Exit code 2 and one line naming the file, as for a path that is no model; nothing started."""
    args = ["serve", "--port", "0"] if command == "serve" else ["generate", "hi"]
    for path, says in _broken(model_dir, tmp_path).values():
        proc = _cli(*args, "--model", str(path), "--device", "cpu")
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert len(lines) == 1 and lines[0].startswith(f"minisgl: error: --model {path}: "), lines
        assert says in lines[0], lines


def _processes_with(tag: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and tag.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_scheduler_that_cannot_build_the_model_stops_serve_with_its_one_line(model_dir, tmp_path):
    """What only the scheduler rank finds (config.json lacks a key the model reads): the command
    line's one ``minisgl: error:`` line and exit code 2, as the launcher's own refusals of --model
    (it was exit 1 and the rank's ModelPathError line), no traceback, no process left behind."""
    bad = _copy(model_dir, tmp_path, "no-intermediate-size")
    _edit_config(bad, intermediate_size=None)
    tag = f"MINISGL_TEST_TAG={uuid.uuid4().hex}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    proc = _cli("serve", "--port", "0", "--model", str(bad), "--device", "cpu", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    says = (
        f"minisgl: error: --model {bad}: config.json has no 'intermediate_size', which Qwen3ForCausalLM needs"
    )
    assert proc.stderr.splitlines()[-1] == says, proc.stderr
    assert _processes_with(tag) == []


QWEN2_TINY = dict(
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, vocab_size=320,
    tie_word_embeddings=False,
)  # fmt: skip


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b", "qwen2.5-7b", "qwen2-tiny"])
def test_the_shape_check_takes_what_transformers_builds(shape):
    """The launcher's header check must never refuse a genuine checkpoint: the names and shapes of
    transformers' own model for each benchmark shape (and Qwen2's q/k/v biases) pass it, and one
    config.json value changed is caught."""
    import torch
    import transformers

    from minisgl_core.bench.shapes import SHAPES
    from minisgl_core.checkpoint.integrity import check_shapes
    from minisgl_core.checkpoint.safetensors_header import TensorEntry

    config = dict(QWEN2_TINY if shape == "qwen2-tiny" else SHAPES[shape])
    with torch.device("meta"):  # (a deep copy: transformers writes rope_theta into rope_scaling)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**copy.deepcopy(config))
        )
    tensors = {
        name: TensorEntry("BF16", tuple(t.shape), "model.safetensors")
        for name, t in model.state_dict().items()
        if not (config["tie_word_embeddings"] and name == "lm_head.weight")  # not saved when tied
    }
    check_shapes(config, tensors)
    with pytest.raises(ValueError, match="config.json does not describe these weights"):
        check_shapes({**config, "intermediate_size": config["intermediate_size"] + 16}, tensors)


def test_a_format_failing_to_read_the_next_tensor_is_not_blamed_on_the_last_one(model_dir, monkeypatch):
    """A weight format's ValueError while reading a tensor was "weight <the tensor before it>: ..."
    (a GGUF probe: the damaged attn_q was reported as o_proj)."""
    from minisgl_core.checkpoint.formats import SafetensorsFormat

    read = SafetensorsFormat.weights

    def failing(self, dtype):
        for i, item in enumerate(read(self, dtype)):
            if i == 2:
                raise ValueError("the bytes of the third tensor are damaged")
            yield item

    monkeypatch.setattr(SafetensorsFormat, "weights", failing)
    with pytest.raises(ModelPathError) as err:
        Engine(
            EngineConfig(model=str(model_dir), attn="torch", device="cpu"), ParallelContext(), Plugins.load()
        )
    message = str(err.value)
    assert (
        ": reading the weights after " in message and "the bytes of the third tensor are damaged" in message
    )
    assert ": weight " not in message, message

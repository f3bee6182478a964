"""minisgl_core.checkpoint.formats: config files and safetensors checkpoints, single-file and sharded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minisgl_core.checkpoint.formats import iter_checkpoint, load_generation_config, load_hf_config
from minisgl_core.testing import make_model_dir


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("single"), "LlamaForCausalLM", seed=1)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("sharded"), "LlamaForCausalLM", seed=1, num_shards=3)


def test_sharded_and_single_file_give_the_same_tensors(single: Path, sharded: Path) -> None:
    assert (single / "model.safetensors").is_file()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    one = dict(iter_checkpoint(single))
    many = dict(iter_checkpoint(sharded))
    assert one.keys() == many.keys() and "model.layers.1.mlp.down_proj.weight" in one
    for name, tensor in one.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(many[name], tensor, rtol=0, atol=0)


def test_configs_are_parsed(single: Path) -> None:
    config = load_hf_config(single)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == 64
    generation = load_generation_config(single)
    vocab = json.loads((single / "tokenizer.json").read_text())["model"]["vocab"]
    assert generation["eos_token_id"] == [vocab["<|im_end|>"], vocab["<|endoftext|>"]]


def test_missing_generation_config_is_empty(tmp_path: Path) -> None:
    assert load_generation_config(tmp_path) == {}


def test_missing_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_hf_config(tmp_path)


def test_no_weights_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match=r"no weights in .*model\.safetensors or model\.safetensors\.index\.json"
    ):
        iter_checkpoint(tmp_path)


def test_missing_shard_is_named_before_reading(sharded: Path, tmp_path: Path) -> None:
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    for name in [*shards[:-1], "model.safetensors.index.json"]:
        (tmp_path / name).write_bytes((sharded / name).read_bytes())
    with pytest.raises(FileNotFoundError, match=f"shard.*{shards[-1]}"):
        iter_checkpoint(tmp_path)

"""config.json ties the head to the embeddings (tie_word_embeddings) but the checkpoint also holds
its own, different lm_head.weight: that tensor is skipped (vLLM's reading), so the logits are those
of the embedding as head whatever the file order. It used to be loaded into the shared matrix, so
a shard holding lm_head after the embeddings overwrote the embeddings."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from minisgl_plugin_torch.backend import TorchAttentionBackend
from safetensors.torch import load_file, save_file

from minisgl_core.api import ModelConfig, ParallelContext
from minisgl_core.checkpoint.formats import iter_checkpoint
from minisgl_core.config import EngineConfig
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import Plugins
from minisgl_core.testing import greedy_generate, make_attention

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]

PROMPT = [5, 17, 300, 42, 7, 99, 512, 3]


@pytest.fixture(scope="module")
def tied(make_tiny_model) -> Path:
    model = make_tiny_model("LlamaForCausalLM", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(str(model / "model.safetensors"))
    return model


def _copy_without_weights(model: Path, out: Path) -> Path:
    out.mkdir()
    for path in model.iterdir():
        if not path.name.startswith("model") or path.suffix != ".safetensors":
            shutil.copy(path, out / path.name)
    return out


def _with_lm_head(tied: Path, out: Path, *, sharded: bool) -> Path:
    """``tied``'s checkpoint plus a random lm_head.weight: in model.safetensors, or alone in the
    last of two shards (where transformers' save order puts it)."""
    tensors = load_file(str(tied / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    head = torch.randn(embed.shape, generator=torch.Generator().manual_seed(7))
    _copy_without_weights(tied, out)
    if not sharded:
        save_file(
            {**tensors, "lm_head.weight": head}, str(out / "model.safetensors"), metadata={"format": "pt"}
        )
        return out
    first, last = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file(tensors, str(out / first), metadata={"format": "pt"})
    save_file({"lm_head.weight": head}, str(out / last), metadata={"format": "pt"})
    weight_map = {name: first for name in tensors} | {"lm_head.weight": last}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def _load(model: Path) -> tuple[torch.nn.Module, set[str], list[str]]:
    hf = json.loads((model / "config.json").read_text())
    cls = Plugins.load().resolve("models", hf["architectures"][0])
    built = cls(ModelConfig(hf, torch.float32, torch.device("cpu"), ParallelContext()))
    names = [name for name, _ in iter_checkpoint(model)]
    return built, built.load_weights(iter_checkpoint(model)), names


def _logits(model: torch.nn.Module) -> torch.Tensor:
    attn = make_attention(TorchAttentionBackend, model.kv_spec)
    with torch.no_grad():
        _, logits = greedy_generate(model.eval(), attn, PROMPT, 3)
    return torch.stack(logits)


@pytest.mark.parametrize("sharded", [False, True], ids=["one-file", "lm_head-in-last-shard"])
def test_a_checkpoint_lm_head_is_skipped_when_config_ties_the_embeddings(tied, tmp_path, sharded):
    reference, _, _ = _load(tied)
    model, used, names = _load(_with_lm_head(tied, tmp_path / "m", sharded=sharded))
    assert "lm_head.weight" in names and "lm_head.weight" not in used  # the core reports it unused
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(
        model.model.embed_tokens.weight, reference.model.embed_tokens.weight, rtol=0, atol=0
    )
    torch.testing.assert_close(_logits(model), _logits(reference), rtol=0, atol=0)


def test_the_file_order_does_not_change_the_logits(tied, tmp_path):
    one = _logits(_load(_with_lm_head(tied, tmp_path / "one", sharded=False))[0])
    sharded = _logits(_load(_with_lm_head(tied, tmp_path / "sharded", sharded=True))[0])
    torch.testing.assert_close(one, sharded, rtol=0, atol=0)


def test_the_skipped_lm_head_is_named_in_the_unused_tensors_warning(tied, tmp_path, caplog):
    model = _with_lm_head(tied, tmp_path / "m", sharded=True)
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        engine = Engine(
            EngineConfig(model=str(model), attn="torch", device="cpu", num_kv_tokens=256),
            ParallelContext(),
            Plugins.load(),
        )
    engine.close()
    assert "did not use 1 checkpoint tensors: lm_head.weight" in caplog.text, caplog.text

"""Qwen3ForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from minisgl_plugin_qwen3.model import Qwen3ForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.testing import demo_model_dir, make_model_dir
from minisgl_core.testing.reference import check_batch_against_transformers, check_greedy_against_transformers

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied-hd16": {},
    "mha-tied-hd64": dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True
    ),
    "gqa4-hd128-bias": dict(
        hidden_size=128,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        attention_bias=True,
        num_hidden_layers=3,
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"qwen3-{request.param}")
    return make_model_dir(out, "Qwen3ForCausalLM", seed=3, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Qwen3ForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(Qwen3ForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_sharded_checkpoint_loads_the_same_model(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, "Qwen3ForCausalLM", seed=5, num_shards=3)
    assert (model_dir / "model.safetensors.index.json").is_file()
    check_greedy_against_transformers(Qwen3ForCausalLM, model_dir, TorchAttentionBackend, steps=2)


def test_demo_model_matches_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded default model the server starts with is a real Qwen3 checkpoint for transformers."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    tokens = check_greedy_against_transformers(
        Qwen3ForCausalLM, demo_model_dir(), TorchAttentionBackend, steps=4
    )
    assert len(set(tokens)) > 1

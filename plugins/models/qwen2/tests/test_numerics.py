"""Qwen2ForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from minisgl_plugin_qwen2.model import Qwen2ForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.checkpoint.formats import iter_checkpoint
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    load_model,
)

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied": {},
    # Qwen2.5-0.5B's proportions: 14 q heads over 2 KV heads, head_dim 64, tied embeddings
    "gqa7-tied-hd64": dict(
        hidden_size=448,
        num_attention_heads=7,
        num_key_value_heads=1,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=1e6,
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"qwen2-{request.param}")
    return make_model_dir(out, "Qwen2ForCausalLM", seed=11, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Qwen2ForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(Qwen2ForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_q_k_v_have_a_bias_and_o_proj_none(model_dir: Path) -> None:
    """What transformers' Qwen2 builds, with no config.json key saying so: a checkpoint's q/k/v
    biases must reach the model (a model without them would drop them and compute other numbers)."""
    names = {name for name, _ in iter_checkpoint(model_dir)}
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= names
    assert "model.layers.0.self_attn.o_proj.bias" not in names
    model, used = load_model(Qwen2ForCausalLM, model_dir)
    assert names <= used
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None

"""LlamaForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_llama.model import LlamaForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.testing import greedy_generate, make_attention, make_model_dir
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    load_model,
)

LLAMA3_ROPE = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=16,
)

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied-hd16": {},
    "mha-tied-hd64-llama3": dict(
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=True,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE,
    ),
    "mqa-hd64-bias": dict(
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        attention_bias=True,
        mlp_bias=True,
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"llama-{request.param}")
    return make_model_dir(out, "LlamaForCausalLM", seed=7, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        LlamaForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(LlamaForCausalLM, model_dir, TorchAttentionBackend, page_size=3)


def test_head_dim_defaults_to_hidden_over_heads(tmp_path: Path) -> None:
    """Older Llama configs have no head_dim: it must come from hidden_size / num_attention_heads."""
    model_dir = make_model_dir(
        tmp_path,
        "LlamaForCausalLM",
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
    )
    hf_config = load_hf_config(model_dir)
    del hf_config["head_dim"]
    check_greedy_against_transformers(
        LlamaForCausalLM, model_dir, TorchAttentionBackend, steps=3, hf_config=hf_config
    )


def test_llama3_rope_scaling_changes_the_output(tmp_path: Path) -> None:
    """Guards the llama3 case above against passing vacuously: without the scaling the logits
    differ, so the match with transformers really checks the scaled frequencies."""
    model_dir = make_model_dir(tmp_path, "LlamaForCausalLM", **SHAPES["mha-tied-hd64-llama3"])
    hf_config = load_hf_config(model_dir)
    assert hf_config.get("rope_parameters", hf_config.get("rope_scaling"))["rope_type"] == "llama3"
    unscaled = {**hf_config, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    unscaled.pop("rope_scaling", None)
    outputs = []
    for config in (hf_config, unscaled):
        model, _ = load_model(LlamaForCausalLM, model_dir, hf_config=config)
        _, logits = greedy_generate(
            model, make_attention(TorchAttentionBackend, model.kv_spec), list(range(3, 40)), 0
        )
        outputs.append(logits[0])
    assert (outputs[0] - outputs[1]).abs().max() > 1e-2
    assert torch.isfinite(outputs[0]).all()

"""GraniteForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy
decode, with multipliers far from 1 (tied and untied embeddings, GQA, biases); each multiplier
shown to matter to the comparison; two gloo ranks of tensor parallelism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_granite.model import GraniteForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    TransformersReference,
    assert_logits_close,
    check_batch_against_transformers,
    check_greedy_against_transformers,
    greedy_on_ranks,
    load_model,
)

#: Granite-3's kind of values (3.1-8B: 12, 0.22, 0.0078125, 16), none of them 1 or head_dim ** -0.5
MULTIPLIERS = dict(embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
                   logits_scaling=8.0)  # fmt: skip
#: with tied embeddings a random model whose residual stream is mostly its input's (scaled)
#: embedding predicts that token again and again: its layers are given more weight instead
TIED_MULTIPLIERS = dict(embedding_multiplier=0.5, residual_multiplier=3.0, attention_multiplier=0.03125,
                        logits_scaling=8.0)  # fmt: skip

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied": {},
    # Granite-3's proportions: 4 q heads per KV head, tied embeddings (here 8 over 2, head_dim 32)
    "gqa4-hd32-tied": dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                           tie_word_embeddings=True, rope_theta=10000000.0),
    # biases on o_proj and down_proj are scaled with their weights
    "biases-tied": dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
}  # fmt: skip


def granite_dir(out: Path, seed: int, **overrides: Any) -> Path:
    multipliers = TIED_MULTIPLIERS if overrides.get("tie_word_embeddings") else MULTIPLIERS
    return make_model_dir(out, "GraniteForCausalLM", seed=seed, **{**multipliers, **overrides})


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return granite_dir(tmp_path_factory.mktemp(f"granite-{request.param}"), 23, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        GraniteForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(GraniteForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


@pytest.mark.parametrize("key", list(MULTIPLIERS))
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_model_without_one_multiplier_would_fail(tmp_path: Path, key: str, tied: bool) -> None:
    """The comparison above is not blind to any multiplier: the same model built as if config.json
    lacked one (1.0, transformers' default) no longer matches transformers."""
    model_dir = granite_dir(tmp_path / "granite", 5, tie_word_embeddings=tied)
    check_greedy_against_transformers(GraniteForCausalLM, model_dir, TorchAttentionBackend, steps=2)
    without = {**load_hf_config(model_dir), key: 1.0}
    with pytest.raises(AssertionError, match="logits of step 0"):
        check_greedy_against_transformers(
            GraniteForCausalLM, model_dir, TorchAttentionBackend, steps=2, hf_config=without
        )


def test_the_attention_scale_is_the_attention_multiplier(tmp_path: Path) -> None:
    model, _ = load_model(GraniteForCausalLM, granite_dir(tmp_path / "granite", 1))
    assert model.kv_spec.scale == MULTIPLIERS["attention_multiplier"]
    assert model.kv_spec.head_dim == 16  # (so not head_dim ** -0.5, 0.25)


def test_weights_of_another_dtype_than_floats_are_refused(tmp_path: Path) -> None:
    """A pre-quantized layer (packed integers where o_proj's weight was) cannot have the residual
    multiplier folded into it: refused at load, naming why."""
    model_dir = granite_dir(tmp_path / "granite", 1)
    model, _ = load_model(GraniteForCausalLM, model_dir)
    o_proj = model.model.layers[0].self_attn.o_proj
    o_proj.weight = torch.nn.Parameter(
        torch.zeros(o_proj.weight.shape, dtype=torch.int32), requires_grad=False
    )
    with pytest.raises(ValueError, match="pre-quantized Granite checkpoints are not supported"):
        model._fold_multipliers()


STEPS = 6


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path, tied: bool) -> None:
    """Two gloo ranks, each with half the heads, half the MLP and half the vocabulary, every shard
    scaled on its own: both ranks' logits and greedy tokens are transformers'."""
    model_dir = granite_dir(tmp_path / "granite", 7, tie_word_embeddings=tied, vocab_size=1027)
    results = greedy_on_ranks(
        GraniteForCausalLM, TorchAttentionBackend, model_dir, tmp_path, prompt_len=20, steps=STEPS
    )
    reference = TransformersReference(model_dir)
    for rank in range(2):
        prompt, tokens, logits = results[rank]
        expected_tokens, expected_logits = reference.greedy(prompt, STEPS)
        for step, (actual, expected) in enumerate(zip(logits, expected_logits, strict=True)):
            assert_logits_close(actual, expected, what=f"rank {rank}'s logits of step {step}")
        assert tokens == expected_tokens
        assert len(set(tokens)) > 1


@pytest.mark.parametrize("value", [0, -2.0, "8", True, None])
def test_a_multiplier_that_is_not_a_positive_number_is_named(value: Any) -> None:
    hf = {"architectures": ["GraniteForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, **MULTIPLIERS}
    assert GraniteForCausalLM.unsupported_setting(hf) is None
    assert GraniteForCausalLM.unsupported_setting({**hf, "logits_scaling": value}) == (
        f"logits_scaling {json.dumps(value)} is not supported (a positive number is)"
    )

"""Olmo2ForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy
decode (tied and untied embeddings, GQA and MHA, attention biases, page sizes 1 and 4), batched
steps, and two gloo ranks of tensor parallelism, whose q/k norms need the sums of squares of both
ranks' heads (with two KV heads a rank, and with one KV head held by both ranks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from minisgl_plugin_olmo2.model import Olmo2ForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    TransformersReference,
    assert_logits_close,
    check_batch_against_transformers,
    check_greedy_against_transformers,
    greedy_on_ranks,
    load_model,
)

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied": {},
    # OLMo-2-7B's kind: as many KV heads as q heads, tied here (its head_dim 128 is hidden / heads)
    "mha-hd32-tied": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                          tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-6),
    "biases-gqa4": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=8, attention_bias=True),
}  # fmt: skip


def olmo2_dir(out: Path, seed: int, **overrides: Any) -> Path:
    return make_model_dir(out, "Olmo2ForCausalLM", seed=seed, **overrides)


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return olmo2_dir(tmp_path_factory.mktemp(f"olmo2-{request.param}"), 23, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Olmo2ForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(Olmo2ForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_the_checkpoint_names_are_transformers(tmp_path: Path) -> None:
    """q_norm/k_norm span the whole projections and each layer has its two post-branch norms and
    no input norm: the parameters are the checkpoint's tensors, q/k/v and gate/up packed."""
    model_dir = olmo2_dir(tmp_path / "olmo2", 1)
    model, used = load_model(Olmo2ForCausalLM, model_dir)
    layer = "model.layers.0."
    assert {
        name.removeprefix(layer) for name in used if name.startswith(layer)
    } == {f"self_attn.{p}_proj.weight" for p in "qkvo"} | {
        "self_attn.q_norm.weight", "self_attn.k_norm.weight",
        "post_attention_layernorm.weight", "post_feedforward_layernorm.weight",
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    }  # fmt: skip
    attention = model.model.layers[0].self_attn
    assert attention.q_norm.weight.shape == (4 * 16,) and attention.k_norm.weight.shape == (2 * 16,)


STEPS = 6


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(num_key_value_heads=1, tie_word_embeddings=True)],
    ids=["kv2-untied", "kv1-shared-tied"],
)
def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path, overrides: dict[str, Any]) -> None:
    """Two gloo ranks, each with half the q heads (and half the KV heads, or the one KV head both
    hold), half the MLP and half the vocabulary, and the slices of q_norm/k_norm that match its
    heads: both ranks' logits and greedy tokens are transformers'."""
    model_dir = olmo2_dir(tmp_path / "olmo2", 7, vocab_size=1027, **overrides)
    results = greedy_on_ranks(
        Olmo2ForCausalLM, TorchAttentionBackend, model_dir, tmp_path, prompt_len=20, steps=STEPS
    )
    reference = TransformersReference(model_dir)
    for rank in range(2):
        prompt, tokens, logits = results[rank]
        expected_tokens, expected_logits = reference.greedy(prompt, STEPS)
        for step, (actual, expected) in enumerate(zip(logits, expected_logits, strict=True)):
            assert_logits_close(actual, expected, what=f"rank {rank}'s logits of step {step}")
        assert tokens == expected_tokens
        assert len(set(tokens)) > 1

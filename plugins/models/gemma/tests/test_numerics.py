"""GemmaForCausalLM and Gemma2ForCausalLM against transformers: same random weights, fp32 on CPU,
prefill of a 40-token prompt + greedy decode (tied and untied embeddings, GQA and MHA, a head_dim
that is not hidden / heads, page sizes 1 and 4), batched steps, and two gloo ranks of tensor
parallelism. Gemma 2's soft-caps are set small (attention 2.0, logits 3.0) so that they change
the result, and its ``query_pre_attn_scalar`` is not ``head_dim``, so a wrong scale shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_gemma.model import Gemma2ForCausalLM, GemmaForCausalLM, embedding_scale
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
    random_prompt,
)

#: small enough to change the attention and the logits of the tiny models (scores and logits of
#: order one to a few)
CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0, query_pre_attn_scalar=8)

SHAPES: dict[str, tuple[type, dict[str, Any]]] = {
    # tied, as every Gemma checkpoint; a wider init so that the tied model does not just repeat
    "gemma-tied": (GemmaForCausalLM, dict(initializer_range=0.7)),
    # Gemma-7B's kind: as many KV heads as q heads, a head_dim that is not hidden / heads
    "gemma-mha-hd48-untied": (GemmaForCausalLM, dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                                                     head_dim=48, tie_word_embeddings=False)),
    "gemma2-capped-untied": (Gemma2ForCausalLM, dict(tie_word_embeddings=False, **CAPS)),
    # (a narrower init: with the usual one this tied model just repeats its input)
    "gemma2-capped-tied-gqa4": (Gemma2ForCausalLM, dict(num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                                        initializer_range=0.05, **CAPS)),
    # null caps (none), and the default scale (query_pre_attn_scalar 256)
    "gemma2-uncapped": (Gemma2ForCausalLM, dict(tie_word_embeddings=False, attn_logit_softcapping=None,
                                                final_logit_softcapping=None)),
}  # fmt: skip

ARCH = {GemmaForCausalLM: "GemmaForCausalLM", Gemma2ForCausalLM: "Gemma2ForCausalLM"}


def gemma_dir(out: Path, model_cls: type, seed: int, **overrides: Any) -> Path:
    return make_model_dir(out, ARCH[model_cls], seed=seed, **overrides)


@pytest.fixture(scope="module", params=list(SHAPES))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[type, Path]:
    model_cls, overrides = SHAPES[request.param]
    return model_cls, gemma_dir(tmp_path_factory.mktemp(request.param), model_cls, 23, **overrides)


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(case: tuple[type, Path], page_size: int) -> None:
    model_cls, model_dir = case
    tokens = check_greedy_against_transformers(
        model_cls, model_dir, TorchAttentionBackend, prompt_len=40, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(case: tuple[type, Path]) -> None:
    model_cls, model_dir = case
    check_batch_against_transformers(
        model_cls, model_dir, TorchAttentionBackend, prompt_lens=(5, 40, 11), page_size=2
    )


def test_the_soft_caps_change_the_tiny_model(tmp_path: Path) -> None:
    """The caps of the capped shapes bite: without each, transformers' own logits move by more
    than the tolerance the comparisons use (so a model ignoring one cannot pass them)."""
    from transformers import AutoModelForCausalLM

    model_dir = gemma_dir(tmp_path / "g2", Gemma2ForCausalLM, 23, tie_word_embeddings=False, **CAPS)
    prompt = torch.tensor([random_prompt(40, load_hf_config(model_dir)["vocab_size"])])

    def logits(**changes: Any) -> torch.Tensor:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        )
        for key, value in changes.items():
            setattr(model.config, key, value)
            for layer in model.model.layers:
                if key == "attn_logit_softcapping":
                    layer.self_attn.attn_logit_softcapping = value
        with torch.inference_mode():
            return model(input_ids=prompt).logits[0]

    capped = logits()
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        uncapped = logits(**{key: None})
        assert float((capped - uncapped).abs().max()) > 1e-2 * max(1.0, float(capped.abs().max())), key


def test_the_embedding_scale_is_rounded_to_the_run_dtype() -> None:
    """As transformers multiplies by ``sqrt(hidden_size)`` cast to the weights' dtype (which a
    float32 comparison cannot see): Gemma-7B's 55.43 is 55.5 in bfloat16."""
    assert embedding_scale({"hidden_size": 3072}, torch.bfloat16) == 55.5
    assert embedding_scale({"hidden_size": 3072}, torch.float32) == pytest.approx(3072**0.5, rel=1e-7)
    assert embedding_scale({"hidden_size": 2304}, torch.bfloat16) == 48.0


def test_the_checkpoint_names_are_transformers(tmp_path: Path) -> None:
    """Gemma 2's four norms a layer and Gemma's two, q/k/v and gate/up packed; the tied head reads
    the embedding table (no lm_head tensor)."""
    layer = "model.layers.0."
    for model_cls, norms in (
        (GemmaForCausalLM, {"input_layernorm", "post_attention_layernorm"}),
        (Gemma2ForCausalLM, {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                             "post_feedforward_layernorm"}),
    ):  # fmt: skip
        model_dir = gemma_dir(tmp_path / ARCH[model_cls], model_cls, 1)
        model, used = load_model(model_cls, model_dir)
        assert {name.removeprefix(layer) for name in used if name.startswith(layer)} == {
            *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"{norm}.weight" for norm in norms),
            *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        }
        assert "lm_head.weight" not in used and model.lm_head.weight is model.model.embed_tokens.weight


def test_gemmas_legacy_gelu_is_the_tanh_approximation(tmp_path: Path) -> None:
    """Gemma's released config.json says ``hidden_act: "gelu"``, which transformers reads as the
    tanh approximation (GemmaConfig's conversion): so does the plugin."""
    model_dir = gemma_dir(tmp_path / "g", GemmaForCausalLM, 5, initializer_range=0.7)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    check_greedy_against_transformers(
        GemmaForCausalLM, model_dir, TorchAttentionBackend, prompt_len=12, steps=3
    )


@pytest.mark.parametrize(
    ("model_cls", "changes", "says"),
    [
        (GemmaForCausalLM, {"hidden_act": "silu"}, 'hidden_act "silu" is not supported (gelu_pytorch_tanh is)'),
        (Gemma2ForCausalLM, {"hidden_activation": "gelu"},
         'hidden_activation "gelu" is not supported (gelu_pytorch_tanh is)'),
        (Gemma2ForCausalLM, {"attn_logit_softcapping": -1},
         "attn_logit_softcapping -1 is not supported (a positive number, or null for none, is)"),
    ],
)  # fmt: skip
def test_settings_it_cannot_build_are_named(model_cls: type, changes: dict[str, Any], says: str) -> None:
    config = {"hidden_size": 64, "max_position_embeddings": 2048, "sliding_window": 4096, **changes}
    assert model_cls.unsupported_setting(config) == says


def test_the_sliding_window_and_its_layers() -> None:
    """Gemma 2 slides on alternate layers (API 2.7: the backend applies it): the even ones where
    config.json has no layer_types, as Gemma2Config; a config without sliding_window has its 4096;
    a layer_types without a sliding layer has no window. Gemma 1 has none."""
    config = {"max_position_embeddings": 8192, "sliding_window": 2048, "num_hidden_layers": 4}
    assert Gemma2ForCausalLM.unsupported_setting(config) is None
    assert Gemma2ForCausalLM.sliding_window_layers(config) == (2048, frozenset({0, 2}))
    default = {key: value for key, value in config.items() if key != "sliding_window"}
    assert Gemma2ForCausalLM.sliding_window_layers(default) == (4096, frozenset({0, 2}))
    listed = {**config, "layer_types": ["full_attention", "sliding_attention"] * 2}
    assert Gemma2ForCausalLM.sliding_window_layers(listed) == (2048, frozenset({1, 3}))
    full = {**config, "layer_types": ["full_attention"] * 4}
    assert Gemma2ForCausalLM.sliding_window_layers(full) == (0, frozenset())
    assert GemmaForCausalLM.sliding_window_layers(config) == (0, frozenset())  # (Gemma 1 has no window)


STEPS = 6


def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path) -> None:
    """Two gloo ranks of a capped Gemma 2, each with half the heads, half the MLP and half the
    vocabulary: both ranks' logits and greedy tokens are transformers'."""
    model_dir = gemma_dir(
        tmp_path / "g2", Gemma2ForCausalLM, 7, vocab_size=1027, tie_word_embeddings=False, **CAPS
    )
    results = greedy_on_ranks(
        Gemma2ForCausalLM, TorchAttentionBackend, model_dir, tmp_path, prompt_len=30, steps=STEPS
    )
    reference = TransformersReference(model_dir)
    for rank in range(2):
        prompt, tokens, logits = results[rank]
        expected_tokens, expected_logits = reference.greedy(prompt, STEPS)
        for step, (actual, expected) in enumerate(zip(logits, expected_logits, strict=True)):
            assert_logits_close(actual, expected, what=f"rank {rank}'s logits of step {step}")
        assert tokens == expected_tokens
        assert len(set(tokens)) > 1

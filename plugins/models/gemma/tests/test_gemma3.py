"""Gemma3ForCausalLM (text) against transformers' Gemma3ForCausalLM: same random weights, fp32 on
CPU, prefill of a 40-token prompt + greedy decode, batched steps and two gloo ranks.

Every shape has both kinds of layer, so both ropes run: sliding layers rotate with
``rope_local_base_freq`` (1e4), full-attention ones with ``rope_theta`` (1e6), linearly scaled
in some shapes. config.json comes in both layouts found on disk: transformers 5's (``layer_types``
and a ``rope_parameters`` per layer type) and the older one of the released Gemma-3-1B
(``sliding_window_pattern``, ``rope_theta``, ``rope_local_base_freq``, ``rope_scaling``, no
``layer_types``, no ``tie_word_embeddings``). The windows here are as long as the context (the
harness runs full attention); past the window: the engine test at the end and
``tests/test_sliding_window.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_gemma.model import Gemma3ForCausalLM, gemma3_layer_types, gemma3_rope
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core import LLM
from minisgl_core.checkpoint.formats import load_hf_config
from minisgl_core.sampling import SamplingParams
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

ARCH = "Gemma3ForCausalLM"
CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0, query_pre_attn_scalar=8)
LINEAR = {"rope_type": "linear", "factor": 8.0}


def old_layout(model_dir: Path, **changes: Any) -> None:
    """Rewrite config.json as the released Gemma-3-1B's: the pattern instead of ``layer_types``,
    the thetas at the top level, the full layers' scaling in ``rope_scaling``; then ``changes``
    (a None value removes the key)."""
    config = json.loads((model_dir / "config.json").read_text())
    pattern = config.pop("_sliding_window_pattern")
    config.pop("layer_types")
    rope = config.pop("rope_parameters")
    full = dict(rope["full_attention"])
    config.update(
        sliding_window_pattern=pattern,
        rope_theta=full.pop("rope_theta"),
        rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
        rope_scaling=full if full.get("rope_type", "default") != "default" else None,
    )
    (model_dir / "config.json").write_text(json.dumps(config))
    edit(model_dir, **changes)


def edit(model_dir: Path, **changes: Any) -> None:
    """``changes`` to config.json (a None value removes the key)."""
    config = {**json.loads((model_dir / "config.json").read_text()), **changes}
    config = {key: value for key, value in config.items() if value is not None}
    (model_dir / "config.json").write_text(json.dumps(config))


#: name -> (make_model_dir overrides, rewrite to the old layout with these changes, or None)
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    # GQA, layers 0 and 2 slide and 1 attends fully (pattern 2), untied; transformers 5's layout
    "gqa-pattern2-untied": (dict(num_hidden_layers=3, sliding_window_pattern=2, tie_word_embeddings=False), None),
    # Gemma-3-1B's kind: one KV head, tied (config.json without the key: Gemma3TextConfig's True),
    # the old layout, the fourth layer full (the pattern 4); thetas not the defaults
    "1b-layout-tied": (dict(num_hidden_layers=4, sliding_window_pattern=4, num_key_value_heads=1,
                            initializer_range=0.03),
                       dict(tie_word_embeddings=None, rope_theta=5000.0, rope_local_base_freq=50.0)),
    # MHA with a head_dim that is not hidden / heads; layer 0 full (the first layer's rope is the
    # full one), the full layers' rope scaled linearly by 8 (the 4B+ models'), as rope_parameters
    "mha-hd48-linear-untied": (dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=48,
                                    num_hidden_layers=3, tie_word_embeddings=False,
                                    layer_types=["full_attention", "sliding_attention", "full_attention"],
                                    rope_parameters={"full_attention": {"rope_theta": 1e6, **LINEAR},
                                                     "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}})
                               , None),
    # the same scaling in the old layout's rope_scaling, with soft-caps (null by default) set small
    # (the final one changes the result; the attention one transformers ignores), and a
    # query_pre_attn_scalar that is not head_dim
    "capped-linear-old-layout": (dict(num_hidden_layers=3, sliding_window_pattern=3, num_attention_heads=8,
                                      num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, **CAPS),
                                 dict(rope_scaling=LINEAR)),
}  # fmt: skip


def gemma3_dir(out: Path, name: str, seed: int = 23) -> Path:
    overrides, old = SHAPES[name]
    model_dir = make_model_dir(out, ARCH, seed=seed, **overrides)
    if old is not None:
        old_layout(model_dir, **old)
    return model_dir


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gemma3_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_both_kinds_of_layer_and_rope_are_there(model_dir: Path) -> None:
    """(What the comparisons rest on.) transformers reads each config with both kinds of layer,
    the same ones as the plugin, and with two ropes that differ."""
    hf = load_hf_config(model_dir)
    config = TransformersReference(model_dir).model.config
    assert gemma3_layer_types(hf) == config.layer_types
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    for kind in ("sliding_attention", "full_attention"):
        _, ours = gemma3_rope(hf, kind)
        theirs = config.rope_parameters[kind]
        assert (ours["rope_type"], ours["rope_theta"], ours.get("factor")) == (
            theirs["rope_type"],
            theirs["rope_theta"],
            theirs.get("factor"),
        )
    assert gemma3_rope(hf, "sliding_attention")[1] != gemma3_rope(hf, "full_attention")[1]


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Gemma3ForCausalLM, model_dir, TorchAttentionBackend, prompt_len=40, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(
        Gemma3ForCausalLM, model_dir, TorchAttentionBackend, prompt_lens=(5, 40, 11), page_size=2
    )


def test_the_checkpoint_names_are_transformers(tmp_path: Path) -> None:
    """Four norms a layer and the per-head q/k norms; the tied head (config.json without the key)
    reads the embedding table."""
    model_dir = gemma3_dir(tmp_path / "m", "1b-layout-tied", seed=1)
    assert "tie_word_embeddings" not in load_hf_config(model_dir)
    model, used = load_model(Gemma3ForCausalLM, model_dir)
    layer = "model.layers.0."
    assert {name.removeprefix(layer) for name in used if name.startswith(layer)} == {
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        *(f"{norm}.weight" for norm in ("input_layernorm", "post_attention_layernorm")),
        *(f"{norm}.weight" for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm")),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    }
    assert "lm_head.weight" not in used and model.lm_head.weight is model.model.embed_tokens.weight


def test_what_the_shapes_exercise_changes_transformers_result(tmp_path: Path) -> None:
    """The settings the comparisons rely on bite: transformers' own logits move by more than the
    tolerance when the full layers take the sliding ones' rope, when every layer slides (the
    pattern), without the linear scaling, and with the q/k norm weights zeroed (``1 + 0``)."""
    from transformers import AutoModelForCausalLM

    def logits(name: str, q_k_norms: bool = True, **changes: Any) -> torch.Tensor:
        model_dir = gemma3_dir(tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}", name)
        edit(model_dir, **changes)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        )
        if not q_k_norms:
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.data.zero_()
                layer.self_attn.k_norm.weight.data.zero_()
        prompt = torch.tensor([random_prompt(40, model.config.vocab_size)])
        with torch.inference_mode():
            return model(input_ids=prompt).logits[0]

    def differs(a: torch.Tensor, b: torch.Tensor) -> bool:
        return float((a - b).abs().max()) > 1e-2 * max(1.0, float(a.abs().max()))

    base = logits("1b-layout-tied")
    assert differs(base, logits("1b-layout-tied", rope_theta=50.0))  # one rope for every layer
    assert differs(base, logits("1b-layout-tied", sliding_window_pattern=1000))  # no full layer
    assert differs(base, logits("1b-layout-tied", q_k_norms=False))
    scaled = logits("capped-linear-old-layout")
    assert differs(scaled, logits("capped-linear-old-layout", rope_scaling=None))
    assert differs(scaled, logits("capped-linear-old-layout", final_logit_softcapping=None))
    # (transformers' Gemma 3 never applies attn_logit_softcapping: neither does the plugin)
    assert torch.equal(scaled, logits("capped-linear-old-layout", attn_logit_softcapping=None))


def test_which_layers_slide_and_their_window() -> None:
    """``layer_types`` where config.json lists them, else every ``sliding_window_pattern``-th layer
    attends fully (6 by default, as Gemma3TextConfig); ``sliding_window`` 4096 when unset."""
    config = {"max_position_embeddings": 32768, "sliding_window": 512, "num_hidden_layers": 13}
    assert Gemma3ForCausalLM.unsupported_setting(config) is None
    assert Gemma3ForCausalLM.sliding_window_layers(config) == (512, frozenset(range(13)) - {5, 11})
    patterned = {**config, "sliding_window_pattern": 2}
    assert Gemma3ForCausalLM.sliding_window_layers(patterned) == (512, frozenset(range(0, 13, 2)))
    default = {key: value for key, value in config.items() if key != "sliding_window"}
    assert Gemma3ForCausalLM.sliding_window_layers(default)[0] == 4096
    listed = {**config, "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"]}
    assert Gemma3ForCausalLM.sliding_window_layers(listed) == (512, frozenset({1}))
    no_sliding = {**config, "num_hidden_layers": 2, "sliding_window_pattern": 1}
    assert Gemma3ForCausalLM.sliding_window_layers(no_sliding) == (0, frozenset())


def test_the_ropes_of_each_layout() -> None:
    old = {
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    assert gemma3_rope(old, "full_attention")[1] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert gemma3_rope(old, "sliding_attention")[1] == {"rope_type": "default", "rope_theta": 1e4}
    assert gemma3_rope({}, "full_attention")[1] == {"rope_type": "default", "rope_theta": 1e6}
    assert gemma3_rope({}, "sliding_attention")[1] == {"rope_type": "default", "rope_theta": 1e4}
    nested = {
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 2e5}}
    }
    assert gemma3_rope(nested, "full_attention")[1] == {
        "rope_type": "linear",
        "factor": 4.0,
        "rope_theta": 2e5,
    }
    assert gemma3_rope(nested, "sliding_attention")[1] == {"rope_type": "default", "rope_theta": 1e4}


BASE = {"hidden_size": 64, "num_hidden_layers": 6, "max_position_embeddings": 2048, "sliding_window": 512}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
         'rope_scaling rope_type "yarn" is not supported (default, linear are)'),
        ({"rope_parameters": {"sliding_attention": {"rope_type": "dynamic", "rope_theta": 1e4}}},
         'rope_parameters.sliding_attention rope_type "dynamic" is not supported (default, linear are)'),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
         'rope_parameters {"rope_type": "default", "rope_theta": 10000.0} is not supported: Gemma 3 reads one for '
         'each layer type ("sliding_attention", "full_attention")'),
        ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling factor null is not supported (a positive number is)"),
        ({"rope_local_base_freq": 0}, "rope_local_base_freq 0 is not supported (a positive number is)"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default", "partial_rotary_factor": 0.5}}},
         "rope_parameters.full_attention partial_rotary_factor 0.5 is not supported (whole heads are rotated)"),
        ({"sliding_window_pattern": 0}, "sliding_window_pattern 0 is not supported (a positive whole number is)"),
        # (no sliding layer, so no window, but a kind of layer with no rope)
        ({"num_hidden_layers": 2, "layer_types": ["full_attention", "chunked_attention"]},
         'layer_types ["full_attention", "chunked_attention"] is not supported: one of "sliding_attention" or '
         '"full_attention" for each of the 2 layers'),
        ({"use_bidirectional_attention": True},
         "use_bidirectional_attention true is not supported (causal attention is)"),
        ({"hidden_activation": "gelu"}, 'hidden_activation "gelu" is not supported (gelu_pytorch_tanh is)'),
        ({"final_logit_softcapping": 0}, "final_logit_softcapping 0 is not supported (a positive number, or null "
                                         "for none, is)"),
        ({"sliding_window": 0}, "sliding_window 0 is not supported: the window must be a positive number of tokens"),
    ],
)  # fmt: skip
def test_settings_it_cannot_build_are_named(changes: dict[str, Any], says: str) -> None:
    assert Gemma3ForCausalLM.unsupported_setting({**BASE, **changes}) == says
    with pytest.raises(NotImplementedError, match="is not supported"):
        load_model(
            Gemma3ForCausalLM,
            "unused",
            hf_config={
                **BASE,
                "vocab_size": 32,
                "num_attention_heads": 4,
                "intermediate_size": 64,
                "head_dim": 16,
                **changes,
            },
        )


def test_the_soft_caps(tmp_path: Path) -> None:
    """Gemma3TextConfig's default: no soft-caps (Gemma 2's 50 and 30 do not apply); a final one
    set is applied, an attention one is not (as in transformers, see above)."""
    model_dir = gemma3_dir(tmp_path / "m", "gqa-pattern2-untied")
    model, _ = load_model(Gemma3ForCausalLM, model_dir)
    assert model.kv_spec.logits_soft_cap == 0.0 and model.final_logit_softcap == 0.0
    assert model.kv_spec.scale == 256**-0.5
    model_dir = gemma3_dir(tmp_path / "capped", "capped-linear-old-layout")
    model, _ = load_model(Gemma3ForCausalLM, model_dir)
    assert model.kv_spec.logits_soft_cap == 0.0 and model.final_logit_softcap == 3.0
    assert model.kv_spec.scale == 8**-0.5


WINDOW = 8


def test_generation_past_the_window_equals_transformers(tmp_path: Path) -> None:
    """The engine past an 8-token window (layers 0 and 2 slide with the local rope, layer 1
    attends fully with the global one, scaled): a 20-token prompt prefilled in chunks of 6 and 28
    greedy tokens, then the same prompt plus 12 more tokens, most of it from the prefix cache:
    tokens and every step's logprob as transformers computes them."""
    model_dir = make_model_dir(
        tmp_path / "m", ARCH, seed=3, num_hidden_layers=3, sliding_window_pattern=2, sliding_window=WINDOW,
        tie_word_embeddings=False,
    )  # fmt: skip
    old_layout(model_dir, rope_scaling=LINEAR)
    reference = TransformersReference(model_dir)
    assert reference.model.config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    prompt = random_prompt(20, reference.model.config.vocab_size, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True, logprobs=0)
    with LLM(
        model_dir, device="cpu", dtype="float32", attn="torch", max_prefill_tokens=6, page_size=4
    ) as llm:
        spec = llm.engine.runner.model.kv_spec
        assert (spec.sliding_window, spec.window_layers) == (WINDOW, frozenset({0, 2}))
        (first,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        longer = prompt + first.token_ids[:12]
        (second,) = llm.generate([{"prompt_token_ids": longer}], params, use_tqdm=False)
    assert second.num_cached_tokens >= 16
    for tokens, out in ((prompt, first), (longer, second)):
        want, logits = reference.greedy(tokens, 27)
        assert out.token_ids == want
        for entry, step in zip(out.logprobs, logits, strict=True):
            assert math.isclose(entry.logprob, float(step.log_softmax(-1).max()), abs_tol=1e-4)
    assert len(set(first.token_ids)) > 3


STEPS = 6


def test_two_tensor_parallel_ranks_match_transformers(tmp_path: Path) -> None:
    """Two gloo ranks, each with half the q heads, one of the two KV heads (with its q/k norms,
    which every rank holds whole), half the MLP and half the vocabulary: both ranks' logits and
    greedy tokens are transformers'."""
    model_dir = make_model_dir(
        tmp_path / "m", ARCH, seed=7, vocab_size=1027, num_hidden_layers=3, sliding_window_pattern=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    old_layout(model_dir, rope_scaling=LINEAR)
    results = greedy_on_ranks(
        Gemma3ForCausalLM, TorchAttentionBackend, model_dir, tmp_path, prompt_len=30, steps=STEPS
    )
    reference = TransformersReference(model_dir)
    for rank in range(2):
        prompt, tokens, logits = results[rank]
        expected_tokens, expected_logits = reference.greedy(prompt, STEPS)
        for step, (actual, expected) in enumerate(zip(logits, expected_logits, strict=True)):
            assert_logits_close(actual, expected, what=f"rank {rank}'s logits of step {step}")
        assert tokens == expected_tokens
        assert len(set(tokens)) > 1


#: the settings of Gemma-3-1B's config.json (the old layout; 4B+ text configs add rope_scaling)
GEMMA_3_1B = dict(
    architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", hidden_size=1152, intermediate_size=6912,
    num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
    hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768, query_pre_attn_scalar=256,
    rms_norm_eps=1e-6, rope_local_base_freq=10000, rope_theta=1000000, rope_scaling=None, sliding_window=512,
    sliding_window_pattern=6, attn_logit_softcapping=None, final_logit_softcapping=None, attention_bias=False,
)  # fmt: skip


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 8.0}])
def test_a_released_config_reads_as_transformers_reads_it(scaling: dict[str, Any] | None) -> None:
    """Gemma-3-1B's settings (and the 4B+ models' linear scaling): the layer kinds, the window
    and each kind's rope are those of transformers' Gemma3TextConfig built from the same keys."""
    from transformers import Gemma3TextConfig

    hf = {**GEMMA_3_1B, "rope_scaling": scaling}
    theirs = Gemma3TextConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    assert Gemma3ForCausalLM.unsupported_setting(hf) is None
    assert gemma3_layer_types(hf) == theirs.layer_types
    full = {i for i, kind in enumerate(theirs.layer_types) if kind == "full_attention"}
    assert full == {5, 11, 17, 23}
    assert Gemma3ForCausalLM.sliding_window_layers(hf) == (512, frozenset(range(26)) - full)
    for kind in ("sliding_attention", "full_attention"):
        _, ours = gemma3_rope(hf, kind)
        want = theirs.rope_parameters[kind]
        assert (ours["rope_type"], ours["rope_theta"], ours.get("factor")) == (
            want["rope_type"],
            want["rope_theta"],
            want.get("factor"),
        )

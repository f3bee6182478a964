"""Gemma3ForConditionalGeneration (the 4B+ checkpoints) served text-only, against transformers'
Gemma3ForConditionalGeneration given only ``input_ids``: same random weights, fp32 on CPU.

A tiny multimodal model (text and SigLIP vision towers) is built and saved by transformers, then
its config.json is rewritten as the released ones are: ``text_config`` lists only the keys that
differ from Gemma3TextConfig's defaults (no ``max_position_embeddings``, no
``query_pre_attn_scalar``, no rope thetas, ``rope_scaling`` linear 8, ``sliding_window_pattern``),
so the defaults the plugin fills in are transformers'. The weights come in both layouts: the one
transformers' ``save_pretrained`` writes (``language_model.model.*``, as the released
checkpoints) and the one of its modules (``model.language_model.*``, ``model.vision_tower.*``,
``lm_head.weight``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_gemma.model import (
    GEMMA3_TEXT_DEFAULTS,
    Gemma3ForCausalLM,
    Gemma3ForConditionalGeneration,
    gemma3_text_config,
    text_model_name,
)
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core import LLM
from minisgl_core.checkpoint.formats import checkpoint_files, load_hf_config
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.harness import greedy_generate, make_attention
from minisgl_core.testing.reference import (
    TransformersReference,
    assert_logits_close,
    checkpoint_names,
    load_model,
    random_prompt,
)

ARCH = "Gemma3ForConditionalGeneration"
WINDOW = 8
#: the text model's keys config.json lists (the rest are Gemma3TextConfig's defaults: 8 heads, 4
#: KV heads, max_position_embeddings 131072, query_pre_attn_scalar 256, thetas 1e4 and 1e6)
TEXT = dict(
    hidden_size=64, intermediate_size=96, num_hidden_layers=3, head_dim=16, sliding_window=WINDOW,
    sliding_window_pattern=2, rope_scaling={"rope_type": "linear", "factor": 8.0},
)  # fmt: skip
VISION = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
)  # fmt: skip


def multimodal_dir(out: Path, *, tied: bool = True, seed: int = 5, std: float = 0.125) -> Path:
    """A random Gemma3ForConditionalGeneration saved by transformers, with a tokenizer, and its
    config.json written as the released ones are (see the module docstring)."""
    from transformers import Gemma3Config
    from transformers import Gemma3ForConditionalGeneration as Reference

    # (the tokenizer and generation_config.json of a text model's directory)
    model_dir = make_model_dir(out, "Gemma3ForCausalLM", seed=seed)
    text_model = load_hf_config(model_dir)
    for path in checkpoint_files(model_dir):
        path.unlink()
    vocab = text_model["vocab_size"]
    text = {**TEXT, "vocab_size": vocab, "initializer_range": std}
    # (the image ids past the vocabulary, as small models' are: no random prompt holds one)
    tokens = dict(image_token_index=vocab + 2, boi_token_index=vocab, eoi_token_index=vocab + 1)
    top = dict(
        mm_tokens_per_image=4, eos_token_id=text_model["eos_token_id"], tie_word_embeddings=tied,
        initializer_range=std, **tokens,
    )  # fmt: skip
    config = Gemma3Config(text_config=text, vision_config=VISION, architectures=[ARCH], **top)
    torch.manual_seed(seed)
    model = Reference(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") and "language_model" in name:
                param.copy_(0.1 * torch.randn_like(param))  # (Gemma's norms scale by 1 + weight)
    model.save_pretrained(model_dir)
    released = {
        "architectures": [ARCH], "model_type": "gemma3", "torch_dtype": "float32", **top,
        # (with Gemma3TextConfig's tie and eos, which transformers 5 writes into text_config whatever
        # the top level says: the top level's apply)
        "text_config": {"model_type": "gemma3_text", "tie_word_embeddings": True, "eos_token_id": 1, **text},
        "vision_config": {"model_type": "siglip_vision_model", **VISION},
    }  # fmt: skip
    (model_dir / "config.json").write_text(json.dumps(released))
    return model_dir


def module_layout(model_dir: Path, out: Path) -> Path:
    """A copy of ``model_dir`` whose tensors are named as transformers' modules name them:
    ``model.language_model.*``, ``model.vision_tower.*``, ``model.multi_modal_projector.*``,
    ``lm_head.weight``."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for path in model_dir.iterdir():
        if path.suffix != ".safetensors":
            (out / path.name).write_bytes(path.read_bytes())
    renames = (
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    )
    for path in checkpoint_files(model_dir):
        tensors = {}
        for name, tensor in load_file(path).items():
            prefix, new = next((p, n) for p, n in renames if name.startswith(p))
            tensors[new + name[len(prefix) :]] = tensor
        save_file(tensors, out / path.name, metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module", params=["tied", "untied"])
def saved_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tied = request.param == "tied"
    # (a tied random model soon repeats one token: a smaller std keeps its greedy tokens varied)
    return multimodal_dir(tmp_path_factory.mktemp(request.param), tied=tied, std=0.03 if tied else 0.125)


@pytest.fixture(scope="module", params=["saved", "modules"])
def model_dir(
    request: pytest.FixtureRequest, saved_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    if request.param == "saved":
        return saved_dir
    return module_layout(saved_dir, tmp_path_factory.mktemp("modules") / "m")


def test_the_checkpoint_is_what_transformers_writes(saved_dir: Path) -> None:
    """(What the tests rest on.) transformers saves the released layout, with the vision tower
    and the projector; the reference reads the released-style config with the defaults the
    plugin fills in and sliding layers 0 and 2; the module layout loads into transformers too."""
    names = checkpoint_names(saved_dir)
    assert "language_model.model.embed_tokens.weight" in names
    assert any(name.startswith("vision_tower.") for name in names)
    assert any(name.startswith("multi_modal_projector.") for name in names)
    reference = TransformersReference(saved_dir).model
    text = reference.config.text_config
    assert text.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    flat = Gemma3ForConditionalGeneration.read_config(load_hf_config(saved_dir))
    for key in (
        "max_position_embeddings",
        "query_pre_attn_scalar",
        "num_attention_heads",
        "num_key_value_heads",
    ):
        assert key not in load_hf_config(saved_dir)["text_config"]
        assert flat[key] == getattr(text, key) == GEMMA3_TEXT_DEFAULTS[key]
    assert flat["query_pre_attn_scalar"] != flat["head_dim"]  # (so a wrong scale shows)


def test_greedy_decode_matches_transformers(model_dir: Path) -> None:
    """Prefill and greedy decode within the window (the harness attends fully; past the window:
    the engine test below): logits and tokens are transformers'; every tensor is accounted for,
    the text ones used and the vision tower's and the projector's skipped by design."""
    model, used = load_model(Gemma3ForConditionalGeneration, model_dir)
    names = checkpoint_names(model_dir)
    assert any(text_model_name(name) is None for name in names) and used == names
    hf = model.config.hf_config
    prompt = random_prompt(WINDOW - 3, hf["vocab_size"], seed=1)
    tokens, logits = greedy_generate(
        model, make_attention(TorchAttentionBackend, model.kv_spec, page_size=4), prompt, 3
    )
    want_tokens, want_logits = TransformersReference(model_dir).greedy(prompt, 3)
    for step, (actual, expected) in enumerate(zip(logits, want_logits, strict=True)):
        assert_logits_close(actual, expected, what=f"logits of step {step}")
    assert tokens == want_tokens


def test_the_language_model_is_read_from_text_config(saved_dir: Path) -> None:
    """The sizes, the window and its layers, the scale and the tie come from ``text_config`` (and
    the top level's tie), over Gemma3TextConfig's defaults; the top level's eos applies."""
    hf = load_hf_config(saved_dir)
    flat = gemma3_text_config(hf)
    assert "text_config" not in flat and "vision_config" not in flat and flat["architectures"] == [ARCH]
    assert flat["eos_token_id"] == hf["eos_token_id"] != hf["text_config"]["eos_token_id"]
    model, _ = load_model(Gemma3ForConditionalGeneration, saved_dir)
    spec = model.kv_spec
    assert (spec.num_layers, spec.num_qo_heads, spec.num_kv_heads, spec.head_dim) == (3, 8, 4, 16)
    assert (spec.sliding_window, spec.window_layers) == (WINDOW, frozenset({0, 2}))
    assert spec.scale == 256**-0.5
    tied = hf["tie_word_embeddings"]
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


def test_the_vision_weights_are_not_needed(saved_dir: Path, tmp_path: Path) -> None:
    """A checkpoint without the vision tower and the projector loads and gives the same logits."""
    from safetensors.torch import load_file, save_file

    text_only = tmp_path / "text-only"
    text_only.mkdir()
    for path in saved_dir.iterdir():
        if path.suffix != ".safetensors":
            (text_only / path.name).write_bytes(path.read_bytes())
    for path in checkpoint_files(saved_dir):
        kept = {name: t for name, t in load_file(path).items() if text_model_name(name) is not None}
        save_file(kept, text_only / path.name, metadata={"format": "pt"})
    assert not any(text_model_name(name) is None for name in checkpoint_names(text_only))
    full, used_full = load_model(Gemma3ForConditionalGeneration, saved_dir)
    alone, used = load_model(Gemma3ForConditionalGeneration, text_only)
    assert used == checkpoint_names(text_only)
    # every tensor of the full checkpoint accounted for, the vision tower's as skipped by design:
    # the core warns of none as unused
    assert used_full == checkpoint_names(saved_dir)
    for (name, a), (_, b) in zip(full.state_dict().items(), alone.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_generation_past_the_window_equals_transformers(model_dir: Path) -> None:
    """The engine (``LLM``) past the 8-token window, prefill in chunks of 6 and the prefix cache:
    greedy tokens and every step's logprob are transformers' for the conditional-generation model
    given only the prompt's ids. The context is the text config's default 131072 (config.json
    names none), not the engine's 4096."""
    reference = TransformersReference(model_dir)
    vocab = reference.model.config.text_config.vocab_size
    prompt = random_prompt(20, vocab, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=0)
    with LLM(
        model_dir, device="cpu", dtype="float32", attn="torch", max_prefill_tokens=6, page_size=4
    ) as llm:
        runner = llm.engine.runner
        assert runner.max_context_len == 131_072 and runner.vocab_size == vocab
        spec = runner.model.kv_spec
        assert (spec.sliding_window, spec.window_layers) == (WINDOW, frozenset({0, 2}))
        (first,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        longer = prompt + first.token_ids[:10]
        (second,) = llm.generate([{"prompt_token_ids": longer}], params, use_tqdm=False)
    assert second.num_cached_tokens >= 16
    for tokens, out in ((prompt, first), (longer, second)):
        want, logits = reference.greedy(tokens, 19)
        assert out.token_ids == want
        for entry, step in zip(out.logprobs, logits, strict=True):
            assert math.isclose(entry.logprob, float(step.log_softmax(-1).max()), abs_tol=1e-4)
    assert len(set(first.token_ids)) > 2


#: the keys of a released text_config (Gemma-3-4B-it's); the rest are Gemma3TextConfig's defaults
GEMMA_3_4B_TEXT: dict[str, Any] = dict(
    hidden_size=2560, intermediate_size=10240, model_type="gemma3_text", num_hidden_layers=34,
    rope_scaling={"factor": 8.0, "rope_type": "linear"}, sliding_window=1024,
)  # fmt: skip


def test_a_released_config_reads_as_transformers_reads_it() -> None:
    """Gemma-3-4B-it's config.json: the flat config has transformers' values for every key the
    model reads, the layer kinds and the window; the top level's eos ids [1, 106] apply."""
    from transformers import Gemma3Config

    hf = {
        "architectures": [ARCH], "model_type": "gemma3", "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
        "image_token_index": 262144, "mm_tokens_per_image": 256, "text_config": GEMMA_3_4B_TEXT,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_hidden_layers": 27},
    }  # fmt: skip
    theirs = Gemma3Config(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
    text = theirs.text_config
    flat = Gemma3ForConditionalGeneration.read_config(hf)
    for key in GEMMA3_TEXT_DEFAULTS:
        if key not in ("eos_token_id", "tie_word_embeddings"):
            assert flat[key] == getattr(text, key), key
    assert flat["eos_token_id"] == [1, 106] and flat["torch_dtype"] == "bfloat16"
    assert flat["tie_word_embeddings"] is True
    assert Gemma3ForConditionalGeneration.unsupported_setting(flat) is None
    full = frozenset(i for i, kind in enumerate(text.layer_types) if kind == "full_attention")
    assert Gemma3ForConditionalGeneration.sliding_window_layers(flat) == (1024, frozenset(range(34)) - full)


def test_text_model_config_defaults_are_gemma3s() -> None:
    """A Gemma3ForCausalLM config.json that names no ``max_position_embeddings`` (or scale, or
    tie) reads Gemma3TextConfig's defaults, not the engine's generic ones."""
    from transformers import Gemma3TextConfig

    flat = Gemma3ForCausalLM.read_config({"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64})
    theirs = Gemma3TextConfig(hidden_size=64)
    for key in GEMMA3_TEXT_DEFAULTS:
        assert flat[key] == getattr(theirs, key), key
    assert flat["max_position_embeddings"] == 131_072
    # (the engine's reads go through the class: the runner, the launcher)
    from minisgl_core.checkpoint.buildable import model_config
    from minisgl_core.plugins import Plugins

    raw = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 64}
    assert model_config(raw, Plugins.load())["max_position_embeddings"] == 131_072


def test_the_launcher_reads_the_config_as_the_model_does(saved_dir: Path, tmp_path: Path) -> None:
    """The checks before any process starts read the flat config too: the heads split over the
    ranks (8 heads, 4 KV heads: Gemma3TextConfig's, which config.json leaves out), the context
    is 131072, and a setting the model cannot build in text_config is named in one line."""
    from minisgl_core.checkpoint.buildable import model_config
    from minisgl_core.checkpoint.formats import ModelPathError
    from minisgl_core.checkpoint.resolve import check_model
    from minisgl_core.config import ConfigError, EngineConfig
    from minisgl_core.config_args import check_heads_split
    from minisgl_core.plugins import Plugins
    from minisgl_core.server.cli import _context_len

    plugins = Plugins.load()
    raw = load_hf_config(saved_dir)
    assert model_config(raw, plugins) == Gemma3ForConditionalGeneration.read_config(raw)
    check_heads_split(str(saved_dir), 4, plugins)
    with pytest.raises(ConfigError, match="8 attention heads"):
        check_heads_split(str(saved_dir), 3, plugins)
    assert _context_len(EngineConfig(model=str(saved_dir), device="cpu"), plugins) == 131_072
    check_model(str(saved_dir), plugins)
    yarn = tmp_path / "yarn"
    yarn.mkdir()
    for path in saved_dir.iterdir():
        (yarn / path.name).symlink_to(path)
    (yarn / "config.json").unlink()
    config = {
        **raw,
        "text_config": {**raw["text_config"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    }
    (yarn / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelPathError, match='rope_scaling rope_type "yarn" is not supported'):
        check_model(str(yarn), plugins)

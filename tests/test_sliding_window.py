"""Sliding-window attention (API 2.7): Mistral-7B-v0.1 (a 4,096-token window in every layer of a
32,768-token context), Phi-3-mini-4k (2,047 of 4,096), Gemma 2 (alternate layers) and Qwen2 under
``use_sliding_window`` (the layers from ``max_window_layers`` on) were refused past the window.
Now the decoder names the window and its layers in ``KVSpec.sliding_window``/``window_layers``
when the context is longer than it, the backends declaring "sliding_window" apply it (torch
does), and a named backend that does not is refused in one line naming the fixes.

The reference is transformers' model of each architecture on the same weights (float32, eager),
over sequences several windows long; the engine's prefill runs in chunks shorter than the window
and a second request reuses the first one's KV from the prefix cache. Gemma 3 (five layers in six
sliding by default, each kind of layer with its own rope) is checked the same way.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
import torch

from minisgl_core import LLM
from minisgl_core.checkpoint.formats import SafetensorsFormat
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.layers.decoder import DecoderForCausalLM
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.testing.reference import TransformersReference, random_prompt

WINDOW = 8
#: (architecture, config.json changes): each with the window on some layers
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral": ("MistralForCausalLM", {"sliding_window": WINDOW}),
    "phi3": ("Phi3ForCausalLM", {"sliding_window": WINDOW}),
    # Gemma 2's default layer_types: the even layers slide (with its soft-caps, applied too)
    "gemma2": (
        "Gemma2ForCausalLM",
        {
            "sliding_window": WINDOW,
            "num_hidden_layers": 3,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
            "query_pre_attn_scalar": 8,
            "tie_word_embeddings": False,  # (tied, the tiny model repeats one token)
        },
    ),
    # Gemma 3's sliding_window_pattern (as the released config.json, without layer_types): every
    # second layer attends fully, with its own rope; the others slide, with the local rope
    "gemma3": (
        "Gemma3ForCausalLM",
        {
            "sliding_window": WINDOW,
            "num_hidden_layers": 3,
            "sliding_window_pattern": 2,
            "final_logit_softcapping": 3.0,
            "tie_word_embeddings": False,
        },
    ),
    # Qwen2's switch: the layers from max_window_layers on slide
    "qwen2": (
        "Qwen2ForCausalLM",
        {
            "use_sliding_window": True,
            "sliding_window": WINDOW,
            "max_window_layers": 1,
            "num_hidden_layers": 3,
        },
    ),
}
#: layers that slide, as transformers reads each config
SLIDING = {"mistral": {0, 1}, "phi3": {0, 1}, "gemma2": {0, 2}, "gemma3": {0, 2}, "qwen2": {1, 2}}


@pytest.fixture(scope="module", params=list(MODELS), ids=list(MODELS))
def windowed(request, tmp_path_factory):
    arch, changes = MODELS[request.param]
    model_dir = make_model_dir(tmp_path_factory.mktemp(request.param) / "m", arch, seed=3, **changes)
    # as the released Gemma 2 and Qwen2 configs: no layer_types (each config class's default)
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("layer_types", None)
    # (Gemma3TextConfig saves the pattern as "_sliding_window_pattern", the released Gemma 3 configs
    # as "sliding_window_pattern": the key transformers reads when layer_types is absent)
    if "_sliding_window_pattern" in config:
        config["sliding_window_pattern"] = config.pop("_sliding_window_pattern")
    (model_dir / "config.json").write_text(json.dumps(config))
    return request.param, model_dir


def test_the_torch_reference_declares_it():
    assert "sliding_window" in Plugins.load().resolve("attention", "torch").capabilities


def test_generation_past_the_window_equals_transformers(windowed):
    """A 20-token prompt prefilled in chunks of 6 and 28 greedy tokens (six windows), then the
    same prompt plus 12 more tokens, most of it from the prefix cache: tokens and each step's
    logprob as transformers computes them with its sliding-window layers."""
    name, model_dir = windowed
    reference = TransformersReference(model_dir)
    config = reference.model.config
    types = getattr(config, "layer_types", None) or ["sliding_attention"] * config.num_hidden_layers
    sliding = {i for i, kind in enumerate(types) if kind == "sliding_attention"}
    assert sliding == SLIDING[name]  # (what the checks below compare with is windowed)
    vocab = reference.model.config.vocab_size
    prompt = random_prompt(20, vocab, seed=7)
    params = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True, logprobs=0)
    with LLM(
        model_dir, device="cpu", dtype="float32", attn="torch", max_prefill_tokens=6, page_size=4
    ) as llm:
        spec = llm.engine.runner.model.kv_spec
        assert (spec.sliding_window, spec.window_layers) == (WINDOW, frozenset(SLIDING[name]))
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


def test_full_attention_past_the_window_would_differ(windowed):
    """The check above can fail: the same model with its window removed (every layer attending
    fully) makes other tokens or logprobs than transformers' windowed model within 48 tokens."""
    name, model_dir = windowed
    reference = TransformersReference(model_dir)
    prompt = random_prompt(20, reference.model.config.vocab_size, seed=7)
    want, logits = reference.greedy(prompt, 27)
    params = SamplingParams(temperature=0.0, max_tokens=28, ignore_eos=True, logprobs=0)
    with LLM(model_dir, device="cpu", dtype="float32", attn="torch") as llm:
        runner = llm.engine.runner
        for backend in {
            id(runner.prefill_attn): runner.prefill_attn,
            id(runner.decode_attn): runner.decode_attn,
        }.values():
            object.__setattr__(backend.config, "window_layers", frozenset())
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    gaps = [
        abs(e.logprob - float(s.log_softmax(-1).max())) for e, s in zip(out.logprobs, logits, strict=True)
    ]
    assert out.token_ids != want or max(gaps) > 1e-3


def test_a_context_within_the_window_needs_no_backend_declaring_it(windowed, torch_backend_lacking):
    """``--max-context-len`` at the window: no sequence outgrows it, full attention is the model."""
    torch_backend_lacking("nowindow", "sliding_window")
    _, model_dir = windowed
    with LLM(model_dir, device="cpu", dtype="float32", attn="nowindow", max_context_len=WINDOW) as llm:
        assert llm.engine.runner.model.kv_spec.sliding_window == 0
        (out,) = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_a_named_backend_without_it_is_refused_naming_the_fixes(tmp_path, torch_backend_lacking, monkeypatch):
    """In one line, before a weight is read (the model is built first: its config says where the
    window applies)."""
    torch_backend_lacking("nowindow", "sliding_window")

    def no_weights(self, dtype):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(SafetensorsFormat, "weights", no_weights)
    model_dir = make_model_dir(tmp_path / "mistral", "MistralForCausalLM", sliding_window=16)
    refusal = (
        "attention backend 'nowindow' cannot run this model: 2 of its 2 layers attend through a sliding "
        "window of 16 tokens, shorter than the context and 'nowindow' does not declare \"sliding_window\"; "
        "use {attn}, or {context}, within which the window is full attention"
    )
    with pytest.raises(PluginError) as raised:
        LLM(model_dir, device="cpu", dtype="float32", attn="nowindow")
    assert str(raised.value) == refusal.format(attn="attn='torch'", context="max_context_len=16")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = [
        "generate",
        "--model",
        model_dir,
        "--device",
        "cpu",
        "--attn",
        "torch,nowindow",
        "--max-tokens",
        "2",
    ]
    proc = run_cli(env=env, args=[*args, "hi"])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith(refusal.format(attn="--attn torch", context="--max-context-len 16")), proc.stderr


@pytest.mark.parametrize(
    ("needs", "picked"),
    [
        (frozenset({"sliding_window"}), ("fa3", "triton")),  # Mistral, Phi-3, Gemma 3, Qwen2
        (frozenset({"sliding_window", "soft_cap"}), ("fa3", "fi")),  # Gemma 2
    ],
)
def test_attn_auto_on_a_gpu_keeps_the_gpu_kernels(needs, picked):
    """On a GPU (every backend available, as on Hopper), ``--attn auto`` serves a windowed model
    on the bundled GPU kernels as their classes declare them, none falling back to torch."""
    from minisgl_core.runner.model_runner import pick_attention

    class Available:
        def __init__(self, cls) -> None:
            self.capabilities = cls.capabilities

        def availability(self, device):
            return None

    real = Plugins.load()

    class OnAGpu:
        registry = {"attention": {name: None for name in real.registry["attention"]}}

        def resolve(self, kind: str, name: str):
            return Available(real.resolve(kind, name))

    assert pick_attention("auto", torch.device("cuda"), OnAGpu(), needs) == picked  # type: ignore[arg-type]


def test_attn_auto_serves_it_on_the_cpu(tmp_path):
    model_dir = make_model_dir(tmp_path / "mistral", "MistralForCausalLM", sliding_window=16)
    with LLM(model_dir, device="cpu", dtype="float32") as llm:
        assert llm.engine.runner.model.kv_spec.sliding_window == 16
        (out,) = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out.token_ids) == 4


def test_a_windowed_model_runs_no_cascade(tmp_path):
    """Decode steps are not grouped by shared prefix (cascade) for a model whose window applies:
    a window may hide part of the prefix, and every bundled backend attends such a step plainly,
    so the groups' host work and a second set of decode graphs would be spent for nothing. The
    same model with a window as long as its context groups them as ever."""
    for window, cascade in ((16, False), (4096, True)):
        model_dir = make_model_dir(tmp_path / f"w{window}", "MistralForCausalLM", sliding_window=window)
        with LLM(model_dir, device="cpu", dtype="float32", attn="torch") as llm:
            assert llm.engine.runner.cascade is cascade
            assert llm.engine.scheduler.cascade is cascade


@pytest.mark.parametrize(
    ("hf", "expected"),
    [
        # Mistral/Phi-3's rule (window_when_set) is the subclasses'; the decoder's own is Qwen2's
        ({"sliding_window": 16}, (0, set())),
        ({"use_sliding_window": False, "sliding_window": 16}, (0, set())),
        ({"use_sliding_window": True, "sliding_window": 16}, (16, {28, 29})),  # max_window_layers 28
        ({"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}, (16, set(range(30)))),
        # below 0 every layer slides, as in transformers (a range from -2**62 was a MemoryError)
        (
            {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": -(2**62)},
            (16, set(range(30))),
        ),
        (
            {
                "use_sliding_window": True,
                "sliding_window": 16,
                "layer_types": ["full_attention"] * 29 + ["sliding_attention"],
            },
            (16, {29}),
        ),
    ],
)
def test_which_layers_slide(hf, expected):
    window, layers = DecoderForCausalLM.sliding_window_layers({"num_hidden_layers": 30, **hf})
    assert (window, set(layers)) == expected


@pytest.mark.parametrize(
    ("hf", "says"),
    [
        (
            {"use_sliding_window": True, "sliding_window": 0},
            "use_sliding_window true (sliding_window 0) is not supported",
        ),
        (
            {"use_sliding_window": True, "sliding_window": None},
            "use_sliding_window true (sliding_window null)",
        ),
        (
            {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention"]},
            'layer_types ["sliding_attention"] is not supported: one of "sliding_attention" or "full_attention" '
            "for each of the 2 layers",
        ),
        # (int() of it was a ValueError or TypeError traceback from the model's construction where
        # transformers does not validate it, a Llama config; 1.5 silently slid from layer 1, not 2)
        *(
            (
                {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": value},
                f"max_window_layers {json.dumps(value)} is not supported: the first layer with the sliding "
                "window must be a whole number",
            )
            for value in ("x", None, 1.5, True)
        ),
    ],
)
def test_a_window_that_is_no_window_is_refused_naming_it(hf, says):
    problem = DecoderForCausalLM.unsupported_setting({"num_hidden_layers": 2, **hf})
    assert problem is not None and problem.startswith(says), problem

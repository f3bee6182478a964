"""The example plugin against minisgl's conformance kit, plus one generation through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from minisgl_plugin_example.attention import ExampleAttentionBackend
from minisgl_plugin_example.policy import ShortestFirstPolicy

from minisgl_core.testing.attention_suite import AttentionBackendSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.policy_suite import SchedulingPolicySuite

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]


class TestExampleAttention(AttentionBackendSuite):
    backend_cls = ExampleAttentionBackend
    # a few shapes keep the run short; the suite's defaults cover more
    gqa_ratios = (1, 4)
    head_dims = (32,)
    page_sizes = (1, 4)


class TestShortestFirstPolicy(SchedulingPolicySuite):
    policy_cls = ShortestFirstPolicy
    starvation_bound = 48  # max_wait_rounds (32) plus the wait for a free request slot


class TestExamplePackaging(PluginPackagingSuite):
    plugin = "example"
    provides = {"attention": ["example"], "policies": ["shortest-first"]}


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "LlamaForCausalLM"])
def test_generation_matches_transformers(arch: str, make_tiny_model, minisgl_plugins) -> None:
    """Greedy tokens through the engine with this plugin's backend and policy equal transformers'."""
    caches = [name for name in ("radix", "naive") if name in minisgl_plugins.names("caches")]
    if arch not in minisgl_plugins.names("models") or not caches:
        pytest.skip(f"needs a model plugin for {arch} and a cache plugin installed")
    from minisgl_core import LLM, SamplingParams
    from minisgl_core.testing.reference import TransformersReference

    model_dir: Path = make_tiny_model(arch)
    llm = LLM(
        model_dir, attn="example", policy="shortest-first", cache=caches[0], device="cpu", dtype="float32"
    )
    prompts = [[5, 17, 300, 42, 7], [9, 9, 120], list(range(40, 70))]
    outputs = llm.generate(
        prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False
    )
    reference = TransformersReference(model_dir)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.token_ids == reference.greedy(prompt, 3)[0]

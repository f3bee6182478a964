"""A scheduling policy whose plans cannot run (None while requests wait, a request that does not
exist, not a plan at all, an empty decode plan) no longer stalls the engine forever: the core
plans such steps itself and logs, once, what the policy did wrong, naming its plugin."""

from __future__ import annotations

import logging

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm

PLUGIN = """
import os

from minisgl_core.api import DecodePlan, PrefillPlan, SchedulingPolicy, hookimpl

MINISGL_API = "2.0"


class BadPolicy(SchedulingPolicy):
    def schedule(self, state):
        mode = os.environ["STALL_TEST_MODE"]
        if mode == "none":
            return None
        if state.waiting:
            if mode == "bogus":
                return PrefillPlan([(987654, 5)])
            if mode == "list":
                return [(r.rid, r.remaining_prefill) for r in state.waiting]
        if state.running:
            return DecodePlan([] if mode == "emptydecode" else [r.rid for r in state.running])
        return None


@hookimpl
def minisgl_register_policies(register):
    register("stall-test", "minisgl_stall_policy:BadPolicy")
"""

MODES = {
    "none": "planned nothing that runs for 3 rounds in a row",
    "bogus": "prefill plan names 987654 which is not waiting",
    "list": "returned [(",  # the plain list, shown
    "emptydecode": "planned nothing that runs",  # it prefills nothing either
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("m") / "q", "Qwen3ForCausalLM", max_position_embeddings=256)


@pytest.fixture
def plugin_installed(install_plugin_module):
    install_plugin_module("minisgl_stall_policy", "minisgl-stall-policy", PLUGIN)


@pytest.mark.parametrize("mode", MODES)
def test_an_unusable_plan_does_not_stall_the_engine(mode, model_dir, plugin_installed, monkeypatch, caplog):
    monkeypatch.setenv("STALL_TEST_MODE", mode)
    llm = cpu_llm(model_dir, policy="stall-test", mixed_batch=False)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for rid, prompt in enumerate([[5, 6, 7, 8], [9, 10, 11]]):
        engine.add_request(rid, prompt, engine.admit(prompt, params))
    tokens: dict[int, list[int]] = {0: [], 1: []}
    finished: dict[int, str | None] = {}
    with caplog.at_level(logging.WARNING, logger="minisgl_core.scheduler.scheduler"):
        for _ in range(60):  # a dozen steps suffice; before, none of them ever ran anything
            for out in engine.step():
                tokens[out.rid].append(out.token_id)
                if out.finished:
                    finished[out.rid] = out.finish_reason
            if not engine.has_work:
                break
    assert [len(tokens[0]), len(tokens[1])] == [4, 4], f"the engine stalled: {tokens}"
    assert finished == {0: "length", 1: "length"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    named = "scheduling policy 'stall-test' (plugin 'stall_policy', minisgl-stall-policy 0.1.0): "
    assert any(w.startswith(named) and MODES[mode] in w for w in warnings), warnings
    assert len(warnings) == len(set(warnings)) <= 2  # each mistake once, not once a step
    llm.close()

"""Attention logit soft-capping (API 2.6): a model whose attention caps its scores (Gemma 2's
``attn_logit_softcapping``, ``KVSpec.logits_soft_cap``) runs only on backends declaring
"soft_cap"; a named backend that does not is refused at start in one line naming another
``--attn``, and ``--attn auto`` picks among those that do."""

from __future__ import annotations

import os

import pytest
import torch

from minisgl_core import LLM
from minisgl_core.api import AttentionBackend, KVSpec
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.runner.model_runner import attention_needs, check_attention_needs, pick_attention
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.cli_runner import run_cli

CAPPED = dict(attn_logit_softcapping=2.0, final_logit_softcapping=3.0, query_pre_attn_scalar=8)
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def capped_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("gemma2") / "m", "Gemma2ForCausalLM", **CAPPED)


def test_the_torch_reference_declares_it():
    assert "soft_cap" in Plugins.load().resolve("attention", "torch").capabilities


def test_a_named_backend_without_soft_cap_is_refused_naming_one_with_it(capped_dir, torch_backend_lacking):
    torch_backend_lacking("nocap", "soft_cap")
    with pytest.raises(PluginError) as raised:
        LLM(capped_dir, device="cpu", dtype="float32", attn="nocap")
    assert str(raised.value) == (
        "attention backend 'nocap' cannot run this model: it caps attention scores (logits_soft_cap 2) and "
        "'nocap' does not declare \"soft_cap\"; use attn='torch'"
    )
    # decode on it alone: the pair keeps the prefill backend
    with pytest.raises(PluginError, match=r"'nocap' does not declare \"soft_cap\"; use attn='torch'$"):
        LLM(capped_dir, device="cpu", dtype="float32", attn="torch,nocap")


def test_on_the_command_line_it_is_one_line(capped_dir, torch_backend_lacking, tmp_path):
    torch_backend_lacking("nocap", "soft_cap")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli(
        env=env,
        args=[
            "generate",
            "--model",
            capped_dir,
            "--device",
            "cpu",
            "--attn",
            "nocap,torch",
            "--max-tokens",
            "2",
            "hi",
        ],
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "attention backend 'nocap' cannot run this model: it caps attention scores (logits_soft_cap 2) and "
            "'nocap' does not declare \"soft_cap\"; use --attn torch"
        )
    ), proc.stderr


def test_a_model_without_caps_runs_on_such_a_backend(tmp_path, torch_backend_lacking):
    """The refusal is the capped model's only: Gemma 2 with null caps, Gemma, run on it."""
    torch_backend_lacking("nocap", "soft_cap")
    for arch, overrides in (
        ("Gemma2ForCausalLM", dict(attn_logit_softcapping=None)),
        ("GemmaForCausalLM", {}),
    ):
        model_dir = make_model_dir(tmp_path / arch, arch, **overrides)
        with LLM(model_dir, device="cpu", dtype="float32", attn="nocap") as llm:
            (out,) = llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)
        assert len(out.token_ids) == 4


def test_attn_auto_serves_a_capped_model(capped_dir):
    with LLM(capped_dir, device="cpu", dtype="float32") as llm:
        (out,) = llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)
    assert len(out.token_ids) == 4


def check_soft_cap(cap, names, backends, plugins, device):
    """The runner's check for a model whose only need is the soft-cap ``cap``."""
    needs = attention_needs(KVSpec(1, 1, 1, 1, 1.0, logits_soft_cap=cap))
    check_attention_needs(needs, names, backends, plugins, device)


def test_check_soft_cap_names_a_partner_usable_here():
    class NoCap(AttentionBackend):
        capabilities = frozenset({"prefill", "decode"})

    plugins, cpu = Plugins.load(), torch.device("cpu")
    backends = {"nocap": NoCap, "torch": plugins.resolve("attention", "torch")}
    check_soft_cap(0.0, ("nocap", "nocap"), backends, plugins, cpu)  # no cap: anything goes
    check_soft_cap(50.0, ("torch", "torch"), backends, plugins, cpu)
    with pytest.raises(PluginError, match=r"use --attn torch$"):
        check_soft_cap(50.0, ("nocap", "nocap"), backends, plugins, cpu)
    with pytest.raises(PluginError, match=r"use --attn torch$"):
        check_soft_cap(50.0, ("nocap", "torch"), backends, plugins, cpu)
    with pytest.raises(PluginError, match=r"\(logits_soft_cap 50\) and 'nocap' .*; use --attn torch$"):
        check_soft_cap(50.0, ("torch", "nocap"), backends, plugins, cpu)
    plugins.registry["attention"] = {}
    with pytest.raises(PluginError, match=r"; no attention backend installed declares it on cpu$"):
        check_soft_cap(50.0, ("nocap", "nocap"), backends, plugins, cpu)


def test_attn_auto_on_a_gpu_decodes_with_a_backend_declaring_it():
    """Under ``--attn auto`` the runner picks again with "soft_cap" among the needs: a decode
    backend without it (triton) gives way to the next that has it (fi)."""

    class Backend:
        def __init__(self, capabilities: set[str]) -> None:
            self.capabilities = frozenset({"prefill", "decode", *capabilities})

        def availability(self, device):
            return None

    class FakePlugins:
        registry = {
            "attention": {
                "fa3": Backend({"soft_cap"}),
                "fi": Backend({"soft_cap"}),
                "triton": Backend(set()),
                "torch": Backend({"soft_cap"}),
            }
        }

        def resolve(self, kind: str, name: str):
            return self.registry[kind][name]

    gpu = torch.device("cuda")
    assert pick_attention("auto", gpu, FakePlugins()) == ("fa3", "triton")  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, FakePlugins(), frozenset({"soft_cap"})) == ("fa3", "fi")  # type: ignore[arg-type]

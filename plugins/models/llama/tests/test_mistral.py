"""MistralForCausalLM: Llama's decoder under Mistral's name, against transformers' Mistral; a sliding
window shorter than the context is refused in one line before anything loads, and served when the
engine's context is capped at the window (no sequence reaches it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from minisgl_plugin_llama.model import MistralForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.testing import make_model_dir
from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.testing.reference import check_batch_against_transformers, check_greedy_against_transformers


@pytest.mark.parametrize("window", [None, 2048], ids=["no-window", "window-of-the-context"])
def test_matches_transformers_mistral(tmp_path: Path, window: int | None) -> None:
    """Mistral-7B-v0.2/v0.3 have no window (null); a window as long as the context never bites, so
    transformers' sliding-window attention and our full attention are the same numbers."""
    model_dir = make_model_dir(tmp_path / "mistral", "MistralForCausalLM", seed=4, sliding_window=window)
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    tokens = check_greedy_against_transformers(
        MistralForCausalLM, model_dir, TorchAttentionBackend, page_size=4
    )
    assert len(set(tokens)) > 1
    check_batch_against_transformers(MistralForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_a_window_shorter_than_the_context_is_refused_in_one_line(tmp_path: Path) -> None:
    """Mistral-7B-v0.1's 4,096-token window over a 32,768-token context: computed as full attention,
    every token past the window would attend to keys the model never saw together."""
    hf = {"architectures": ["MistralForCausalLM"], "sliding_window": 4096, "max_position_embeddings": 32768}
    fix = "a context of at most 4096 tokens never reaches the window (--max-context-len 4096, or max_context_len=4096 in LLM())"
    says = (
        "sliding_window 4096 (shorter than max_position_embeddings 32768) is not supported: "
        f"sliding-window attention is not implemented; {fix}"
    )
    assert MistralForCausalLM.unsupported_setting(hf) == says
    assert MistralForCausalLM.unsupported_setting({**hf, "sliding_window": None}) is None
    assert MistralForCausalLM.unsupported_setting(hf, context_len=4096) is None
    assert MistralForCausalLM.unsupported_setting(hf, context_len=8192) == (
        "sliding_window 4096 (shorter than the context, 8192 tokens) is not supported: "
        f"sliding-window attention is not implemented; {fix}"
    )
    assert MistralForCausalLM.unsupported_setting(hf, context_len=65536) == says  # capped by the model
    model_dir = make_model_dir(tmp_path / "v01", "MistralForCausalLM", sliding_window=16)
    proc = run_cli(["generate", "--model", model_dir, "--device", "cpu", "--max-tokens", "3", "hi"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"minisgl: error: --model {model_dir}: MistralForCausalLM cannot be built from this model's config: "
        "sliding_window 16 (shorter than max_position_embeddings 2048) is not supported: sliding-window "
        "attention is not implemented; a context of at most 16 tokens never reaches the window "
        "(--max-context-len 16, or max_context_len=16 in LLM())"
    ], proc.stderr
    proc = run_cli(["generate", "--model", model_dir, "--device", "cpu", "--max-tokens", "3", "--max-context-len",
                    "17", "hi"])  # fmt: skip
    assert proc.returncode == 2 and "shorter than the context, 17 tokens" in proc.stderr, proc.stderr


def test_a_window_no_sequence_reaches_is_served_as_transformers_computes_it(tmp_path: Path) -> None:
    """Mistral-7B-v0.1's case in small: a 32-token window over a 2,048-token context, served with
    the context capped at the window (the command line, and LLM()): every sequence fits in the
    window, where transformers' sliding-window attention is full attention; greedy tokens and the
    first token's logprob match transformers' on the same weights."""
    import torch

    from minisgl_core import LLM, SamplingParams
    from minisgl_core.testing.reference import TransformersReference

    model_dir = make_model_dir(tmp_path / "v01", "MistralForCausalLM", seed=5, sliding_window=32)
    proc = run_cli(["generate", "--model", model_dir, "--device", "cpu", "--max-tokens", "3", "--max-context-len",
                    "32", "hi"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    prompt = [5, 17, 300, 42, 9, 77, 120, 3, 64, 250, 11, 12]
    reference = TransformersReference(model_dir)
    want, logits = reference.greedy(prompt, 19)  # 12 + 20 tokens: the window exactly
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=0)
    with LLM(model_dir, device="cpu", dtype="float32", attn="torch", max_context_len=32) as llm:
        (out,) = llm.generate([prompt], params)
    assert out.token_ids == want
    first = torch.log_softmax(logits[0], dim=-1)[want[0]]
    assert abs(out.logprobs[0].logprob - float(first)) < 1e-4

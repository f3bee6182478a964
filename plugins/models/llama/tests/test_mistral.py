"""MistralForCausalLM: Llama's decoder under Mistral's name, against transformers' Mistral; a sliding
window applies in every layer, and the engine's context capped at the window (no sequence reaches
it) is full attention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from minisgl_plugin_llama.model import MistralForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.testing import make_model_dir
from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.testing.reference import check_batch_against_transformers, check_greedy_against_transformers


@pytest.mark.parametrize("window", [None, 2048, 8], ids=["no-window", "window-of-the-context", "window-8"])
def test_matches_transformers_mistral(tmp_path: Path, window: int | None) -> None:
    """Mistral-7B-v0.2/v0.3 have no window (null); a window as long as the context never bites, so
    transformers' sliding-window attention and our full attention are the same numbers; one of 8
    tokens (Mistral-7B-v0.1's kind, API 2.7) is applied in every layer, as transformers does."""
    model_dir = make_model_dir(tmp_path / "mistral", "MistralForCausalLM", seed=4, sliding_window=window)
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    tokens = check_greedy_against_transformers(
        MistralForCausalLM, model_dir, TorchAttentionBackend, page_size=4
    )
    assert len(set(tokens)) > 1
    check_batch_against_transformers(MistralForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_a_window_shorter_than_the_context_applies_in_every_layer() -> None:
    """Mistral-7B-v0.1's 4,096-token window over a 32,768-token context: no switch, every layer
    (API 2.7: the attention backend applies it; served past the window in
    ``tests/test_sliding_window.py``)."""
    hf = {"architectures": ["MistralForCausalLM"], "sliding_window": 4096, "max_position_embeddings": 32768,
          "num_hidden_layers": 32}  # fmt: skip
    assert MistralForCausalLM.unsupported_setting(hf) is None
    assert MistralForCausalLM.sliding_window_layers(hf) == (4096, frozenset(range(32)))
    assert MistralForCausalLM.sliding_window_layers({**hf, "sliding_window": None}) == (0, frozenset())


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

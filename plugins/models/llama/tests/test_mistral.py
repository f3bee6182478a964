"""MistralForCausalLM: Llama's decoder under Mistral's name, against transformers' Mistral; a sliding
window shorter than the context is refused in one line before anything loads."""

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
    says = (
        "sliding_window 4096 (shorter than max_position_embeddings 32768) is not supported: "
        "sliding-window attention is not implemented"
    )
    assert MistralForCausalLM.unsupported_setting(hf) == says
    assert MistralForCausalLM.unsupported_setting({**hf, "sliding_window": None}) is None
    model_dir = make_model_dir(tmp_path / "v01", "MistralForCausalLM", sliding_window=16)
    proc = run_cli(["generate", "--model", model_dir, "--device", "cpu", "--max-tokens", "3", "hi"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"minisgl: error: --model {model_dir}: MistralForCausalLM cannot be built from this model's config: "
        "sliding_window 16 (shorter than max_position_embeddings 2048) is not supported: sliding-window "
        "attention is not implemented"
    ], proc.stderr

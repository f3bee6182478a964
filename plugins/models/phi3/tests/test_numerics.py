"""Phi3ForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode;
its fused checkpoint tensors split for tensor parallelism; what it cannot build refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_phi3.model import Phi3ForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.formats import iter_checkpoint
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    load_model,
)

SHAPES: dict[str, dict[str, Any]] = {
    "gqa-untied": {},
    # Phi-4's proportions: 40 q heads over 10 KV heads, head_dim 128 (here 10 over 5)
    "gqa2-hd32-tied": dict(hidden_size=320, num_attention_heads=10, num_key_value_heads=5, head_dim=32,
                           tie_word_embeddings=True, rope_theta=250000.0),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"phi3-{request.param}")
    return make_model_dir(out, "Phi3ForCausalLM", seed=21, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Phi3ForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(Phi3ForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_the_fused_tensors_are_split_per_rank(tmp_path: Path) -> None:
    """Each rank of a tensor-parallel model takes its own heads of q, k and v and its own rows of
    gate and up out of the fused checkpoint tensors: the two ranks' qkv and gate_up parameters
    are those slices of the full model's."""
    model_dir = make_model_dir(tmp_path / "phi3", "Phi3ForCausalLM", seed=2)
    names = {name for name, _ in iter_checkpoint(model_dir)}
    assert (
        "model.layers.0.self_attn.qkv_proj.weight" in names
        and "model.layers.0.mlp.gate_up_proj.weight" in names
    )
    full, used = load_model(Phi3ForCausalLM, model_dir)
    assert used == names  # the fused tensors are reported as used, under their own names
    whole = dict(full.named_parameters())
    q, kv, inter = 4 * 16, 2 * 16, 128  # the tiny defaults: 4 q / 2 KV heads of 16, intermediate 128
    for rank in range(2):
        shard, _ = load_model(Phi3ForCausalLM, model_dir, parallel=ParallelContext(tp_rank=rank, tp_size=2))
        mine = dict(shard.named_parameters())
        qkv = whole["model.layers.0.self_attn.qkv_proj.weight"]
        expected = torch.cat([
            qkv[rank * q // 2 : (rank + 1) * q // 2],
            qkv[q + rank * kv // 2 : q + (rank + 1) * kv // 2],
            qkv[q + kv + rank * kv // 2 : q + kv + (rank + 1) * kv // 2],
        ])  # fmt: skip
        assert torch.equal(mine["model.layers.0.self_attn.qkv_proj.weight"], expected)
        gate_up = whole["model.layers.0.mlp.gate_up_proj.weight"]
        expected = torch.cat([gate_up[rank * inter // 2 : (rank + 1) * inter // 2],
                              gate_up[inter + rank * inter // 2 : inter + (rank + 1) * inter // 2]])  # fmt: skip
        assert torch.equal(mine["model.layers.0.mlp.gate_up_proj.weight"], expected)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"sliding_window": 0}, "sliding_window 0 is not supported: the window must be a positive number"),
        ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}}, "longrope"),
    ],
)
def test_what_the_decoder_cannot_build_is_named(changes: dict[str, Any], says: str) -> None:
    """The 128k models' longrope and a window of no tokens: refused, not computed as something
    else. (Phi-3-mini-4k's window of 2,047 applies in every layer, API 2.7.)"""
    hf = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, **changes}
    assert says in (Phi3ForCausalLM.unsupported_setting(hf) or "")
    assert Phi3ForCausalLM.unsupported_setting({**hf, "sliding_window": None, "rope_scaling": None}) is None


def test_the_mini_4k_window_applies_in_every_layer() -> None:
    """Phi-3-mini-4k's window of 2,047 (API 2.7: the attention backend applies it)."""
    windowed = {"architectures": ["Phi3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
                "sliding_window": 2047, "max_position_embeddings": 4096, "num_hidden_layers": 2}  # fmt: skip
    assert Phi3ForCausalLM.unsupported_setting(windowed) is None
    assert Phi3ForCausalLM.sliding_window_layers(windowed) == (2047, frozenset({0, 1}))

"""MixtralForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_mixtral.model import MixtralForCausalLM
from minisgl_plugin_torch.backend import TorchAttentionBackend

from minisgl_core.checkpoint.formats import iter_checkpoint
from minisgl_core.layers import SparseMoE
from minisgl_core.layers.moe import route
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    load_model,
)

SHAPES: dict[str, dict[str, Any]] = {
    "top2-of-8": {},  # Mixtral-8x7B's routing
    "top3-of-4-tied": dict(
        num_local_experts=4, num_experts_per_tok=3, tie_word_embeddings=True, rope_theta=1e6
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"mixtral-{request.param}")
    return make_model_dir(out, "MixtralForCausalLM", seed=7, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        MixtralForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(MixtralForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_every_expert_tensor_lands_in_the_block(model_dir: Path) -> None:
    names = {name for name, _ in iter_checkpoint(model_dir)}
    assert "model.layers.0.block_sparse_moe.experts.1.w3.weight" in names
    model, used = load_model(MixtralForCausalLM, model_dir)
    assert names <= used
    block = model.model.layers[0].mlp
    assert isinstance(block, SparseMoE) and block.float32_weights
    tensors = dict(iter_checkpoint(model_dir))
    p = "model.layers.0.block_sparse_moe.experts.1."
    inter = block.experts.inter
    assert torch.equal(block.experts.w13[1, :inter], tensors[p + "w1.weight"])
    assert torch.equal(block.experts.w13[1, inter:], tensors[p + "w3.weight"])
    assert torch.equal(block.experts.w2[1], tensors[p + "w2.weight"])


def test_router_weights_stay_float32_as_transformers_mixtral():
    """transformers' Mixtral router does not round its weights to the model's dtype (Qwen3-MoE's
    does): in bf16 the two differ, and ours must be Mixtral's."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    router = MixtralTopKRouter(MixtralConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=2))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 32, generator=gen))
    router = router.to(torch.bfloat16)
    x = torch.randn(6, 32, generator=gen).to(torch.bfloat16)
    _, want_weights, want_ids = router(x)
    weights, ids = route(torch.nn.functional.linear(x, router.weight), 2, True, float32_weights=True)
    assert weights.dtype == want_weights.dtype == torch.float32
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)

"""Qwen3MoeForCausalLM against transformers: same random weights, fp32 on CPU, prefill + greedy decode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from minisgl_plugin_qwen3_moe.model import Qwen3MoeForCausalLM, num_experts, sparse_layer
from minisgl_plugin_torch.backend import TorchAttentionBackend
from safetensors.torch import load_file, save_file

from minisgl_core.layers.moe import SparseMoE
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    load_model,
)

SHAPES: dict[str, dict[str, Any]] = {
    # 8 experts, 2 a token, top-k weights renormalised (Qwen3-30B-A3B's norm_topk_prob)
    "top2-of-8": {},
    # not renormalised; layer 1 dense (mlp_only_layers) with its own intermediate_size; 3 of 6
    "top3-of-6-dense-layer": dict(
        num_experts=6, num_experts_per_tok=3, norm_topk_prob=False, mlp_only_layers=[1], num_hidden_layers=3
    ),
}


@pytest.fixture(scope="module", params=list(SHAPES))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(f"qwen3moe-{request.param}")
    return make_model_dir(out, "Qwen3MoeForCausalLM", seed=5, **SHAPES[request.param])


@pytest.mark.parametrize("page_size", [1, 4])
def test_greedy_decode_matches_transformers(model_dir: Path, page_size: int) -> None:
    tokens = check_greedy_against_transformers(
        Qwen3MoeForCausalLM, model_dir, TorchAttentionBackend, page_size=page_size
    )
    assert len(set(tokens)) > 1, "greedy decoding of the random model is constant: the test would be weak"


def test_batched_prefill_and_decode_match_transformers(model_dir: Path) -> None:
    check_batch_against_transformers(Qwen3MoeForCausalLM, model_dir, TorchAttentionBackend, page_size=2)


def test_sparse_and_dense_layers_follow_the_config(model_dir: Path) -> None:
    model, _ = load_model(Qwen3MoeForCausalLM, model_dir)
    import json

    hf = json.loads((model_dir / "config.json").read_text())
    kinds = [isinstance(layer.mlp, SparseMoE) for layer in model.model.layers]
    assert kinds == [sparse_layer(hf, i) for i in range(hf["num_hidden_layers"])]
    assert any(kinds)
    if hf.get("mlp_only_layers"):
        dense = model.model.layers[hf["mlp_only_layers"][0]].mlp
        assert dense.gate_up_proj.weight.shape[0] == 2 * hf["intermediate_size"]


def test_fused_expert_tensors_load_the_same(model_dir: Path, tmp_path: Path) -> None:
    """transformers 5 keeps the experts as ``experts.gate_up_proj`` / ``experts.down_proj``: a
    checkpoint written that way loads into the same weights as the per-expert one."""
    import json
    import shutil

    for item in model_dir.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, tmp_path / item.name)
    tensors = load_file(model_dir / "model.safetensors")
    hf = json.loads((model_dir / "config.json").read_text())
    experts = num_experts(hf)  # transformers 5 writes num_local_experts
    fused: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if ".mlp.experts." not in name:
            fused[name] = tensor
    for layer in range(hf["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.0.gate_proj.weight" not in tensors:
            continue
        fused[f"{prefix}.gate_up_proj"] = torch.stack(
            [
                torch.cat(
                    [tensors[f"{prefix}.{e}.gate_proj.weight"], tensors[f"{prefix}.{e}.up_proj.weight"]]
                )
                for e in range(experts)
            ]
        )
        fused[f"{prefix}.down_proj"] = torch.stack(
            [tensors[f"{prefix}.{e}.down_proj.weight"] for e in range(experts)]
        )
    save_file(fused, tmp_path / "model.safetensors")
    a, _ = load_model(Qwen3MoeForCausalLM, model_dir)
    b, used = load_model(Qwen3MoeForCausalLM, tmp_path)
    assert set(fused) <= used
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_a_missing_expert_tensor_is_named(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    for item in model_dir.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, tmp_path / item.name)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.0.mlp.experts.1.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts\.w13.*\(1, 1\)"):
        load_model(Qwen3MoeForCausalLM, tmp_path)

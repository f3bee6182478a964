"""Weight loading of the shared decoder: HF names, tied embeddings, missing tensors, TP shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from minisgl_plugin_llama.model import LlamaForCausalLM

from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.formats import iter_checkpoint, load_hf_config
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.reference import load_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # vocab 1021 is not a multiple of 2 or 4, so the vocabulary shards need padding
    return make_model_dir(
        tmp_path_factory.mktemp("llama"),
        "LlamaForCausalLM",
        vocab_size=1021,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_bias=True,
    )


def full_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return dict(iter_checkpoint(model_dir))


def test_missing_tensor_names_the_parameter(model_dir: Path) -> None:
    model, _ = load_model(LlamaForCausalLM, model_dir)
    weights = {
        k: v for k, v in full_weights(model_dir).items() if k != "model.layers.1.self_attn.k_proj.weight"
    }
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.qkv_proj\.weight.*'k'"):
        model.load_weights(weights.items())
    weights = {k: v for k, v in full_weights(model_dir).items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"'model\.norm\.weight' was never loaded"):
        model.load_weights(weights.items())


def test_unknown_names_are_left_unused(model_dir: Path) -> None:
    model, _ = load_model(LlamaForCausalLM, model_dir)
    weights = full_weights(model_dir)
    weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    used = model.load_weights(weights.items())
    assert used == set(weights) - {"model.layers.0.self_attn.rotary_emb.inv_freq"}


def test_tied_embeddings_share_one_tensor(tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, "LlamaForCausalLM", tie_word_embeddings=True)
    weights = full_weights(model_dir)
    assert "lm_head.weight" not in weights  # transformers does not save the tied copy
    model, used = load_model(LlamaForCausalLM, model_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert used == set(weights)
    # A checkpoint that does carry its own lm_head.weight: skipped (vLLM's reading of the tie),
    # not loaded into the shared tensor, where the file order decided which matrix won
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"] * 2
    assert "lm_head.weight" not in model.load_weights(weights.items())
    torch.testing.assert_close(model.model.embed_tokens.weight, weights["model.embed_tokens.weight"])


@pytest.mark.parametrize("tp_size", [2, 4])
def test_rank_shards_reassemble_the_checkpoint(model_dir: Path, tp_size: int) -> None:
    """Each rank keeps exactly its slice; with 2 KV heads on 4 ranks, ranks share a KV head."""
    weights = full_weights(model_dir)
    ranks = [
        load_model(LlamaForCausalLM, model_dir, parallel=ParallelContext(rank, tp_size))[0]
        for rank in range(tp_size)
    ]
    head_dim, kv_heads = 16, 2

    def cat(name: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([dict(m.named_parameters())[name] for m in ranks], dim)

    vocab = weights["model.embed_tokens.weight"]
    padded = cat("model.embed_tokens.weight")
    assert padded.shape[0] % tp_size == 0 and padded.shape[0] >= vocab.shape[0]
    torch.testing.assert_close(padded[: vocab.shape[0]], vocab, rtol=0, atol=0)
    assert not padded[vocab.shape[0] :].any()
    attn = "model.layers.0.self_attn"
    torch.testing.assert_close(
        cat(f"{attn}.o_proj.weight", dim=1), weights[f"{attn}.o_proj.weight"], rtol=0, atol=0
    )
    torch.testing.assert_close(ranks[1].get_parameter(f"{attn}.o_proj.bias"), weights[f"{attn}.o_proj.bias"])
    for rank, model in enumerate(ranks):
        qkv = model.get_parameter(f"{attn}.qkv_proj.weight")
        q, k, v = qkv.split(model.model.layers[0].self_attn.qkv_proj.output_sizes)
        q_rows = weights[f"{attn}.q_proj.weight"].shape[0] // tp_size
        torch.testing.assert_close(q, weights[f"{attn}.q_proj.weight"][rank * q_rows : (rank + 1) * q_rows])
        kv_head = rank * kv_heads // tp_size  # the KV head this rank's query heads read
        kv_rows = (
            slice(kv_head * head_dim, (kv_head + 1) * head_dim)
            if tp_size > kv_heads
            else slice(rank * head_dim, (rank + 1) * head_dim)
        )
        torch.testing.assert_close(k, weights[f"{attn}.k_proj.weight"][kv_rows])
        torch.testing.assert_close(v, weights[f"{attn}.v_proj.weight"][kv_rows])
        assert model.kv_spec.num_kv_heads == max(1, kv_heads // tp_size)
        assert model.kv_spec.num_qo_heads == 4 // tp_size
    gate_up = torch.cat(
        [m.get_parameter("model.layers.1.mlp.gate_up_proj.weight").chunk(2)[0] for m in ranks]
    )
    torch.testing.assert_close(gate_up, weights["model.layers.1.mlp.gate_proj.weight"], rtol=0, atol=0)


def test_heads_that_do_not_divide_are_an_error(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="num_attention_heads of size 4 is not divisible by tp_size=3"):
        load_model(LlamaForCausalLM, model_dir, parallel=ParallelContext(0, 3))


def test_checkpoint_that_does_not_match_the_config_is_an_error(model_dir: Path) -> None:
    hf_config = {**load_hf_config(model_dir), "num_key_value_heads": 4}
    with pytest.raises(
        ValueError, match=r"checkpoint tensor of shape \(32[,)].* does not fit: expected 64 rows"
    ):
        load_model(LlamaForCausalLM, model_dir, hf_config=hf_config)

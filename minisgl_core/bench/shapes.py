"""Real model shapes with random weights, written as genuine HF model directories.

Weights are generated tensor by tensor on the target device and written straight to sharded
safetensors (an 8B model in well under a minute), so the engine's real loading code reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
        vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960, hidden_act="silu", attention_bias=False,
    ),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=131072, hidden_act="silu", attention_bias=False, mlp_bias=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192),
    ),
    "qwen2.5-7b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944, vocab_size=152064,
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        hidden_act="silu", use_sliding_window=False, sliding_window=131072, max_window_layers=28,
    ),
    # 128 experts of 768, 8 a token, in every layer: 30.5B parameters, 3.3B active a token
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, tie_word_embeddings=False,
        rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960, hidden_act="silu",
        attention_bias=False,
    ),
    # 8 experts of 14,336, 2 a token, in every layer: 46.7B parameters, 12.9B active a token
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=14336,
        num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, tie_word_embeddings=False,
        rope_theta=1000000.0, rms_norm_eps=1e-5, max_position_embeddings=32768, hidden_act="silu",
        sliding_window=None,
    ),
}  # fmt: skip


def experts_of(config: dict[str, Any]) -> tuple[int, int, int]:
    """(experts a sparse layer has, experts a token uses, an expert's intermediate size) of a
    mixture-of-experts shape ((0, 0, 0) for a dense one): Qwen3-MoE's ``num_experts`` and
    ``moe_intermediate_size``, Mixtral's ``num_local_experts`` and ``intermediate_size``."""
    if config.get("num_experts"):
        return config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]
    if config.get("num_local_experts"):
        return config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"]
    return 0, 0, 0


def sparse_layer(config: dict[str, Any], layer: int) -> bool:
    """Whether ``layer`` of a mixture-of-experts shape has the experts (transformers' Qwen3-MoE
    rule, as the qwen3-moe plugin builds it; Mixtral's are in every layer): experts configured,
    not in ``mlp_only_layers``, ``(layer + 1)`` a multiple of ``decoder_sparse_step``."""
    step = config.get("decoder_sparse_step", 1) or 1
    return (
        experts_of(config)[0] > 0
        and layer not in (config.get("mlp_only_layers") or [])
        and (layer + 1) % step == 0
    )


def parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF checkpoint names and shapes of a Llama/Qwen2/Qwen3/Qwen3-MoE decoder (the experts as a
    released checkpoint has them: one gate/up/down tensor each)."""
    h, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }  # fmt: skip
        if sparse_layer(config, i) and config["model_type"] == "mixtral":
            experts, _, moe = experts_of(config)
            shapes[p + "block_sparse_moe.gate.weight"] = (experts, h)
            for e in range(experts):
                x = f"{p}block_sparse_moe.experts.{e}."
                shapes |= {x + "w1.weight": (moe, h), x + "w3.weight": (moe, h), x + "w2.weight": (h, moe)}
        elif sparse_layer(config, i):
            experts, _, moe = experts_of(config)
            shapes[p + "mlp.gate.weight"] = (experts, h)
            for e in range(experts):
                x = f"{p}mlp.experts.{e}."
                shapes |= {x + "gate_proj.weight": (moe, h), x + "up_proj.weight": (moe, h),
                           x + "down_proj.weight": (h, moe)}  # fmt: skip
        else:
            shapes |= {p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter)}  # fmt: skip
        if config["model_type"] in ("qwen3", "qwen3_moe"):
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if config["model_type"] == "qwen2":
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}  # fmt: skip
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``(N, K)`` of each product of a Llama/Qwen3 decoder layer as the engine runs it (``y = x @
    W.T``, ``W`` ``[N, K]``; q/k/v fused, gate/up fused) and of the LM head: the shapes the GEMM
    and GEMV tools time. A mixture-of-experts shape: one expert's gate/up and down (its token's
    ``num_experts_per_tok`` experts each run them) and the router instead of the dense MLP."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    experts, _, moe_inter = experts_of(config)
    inter = moe_inter if experts else config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {
        "qkv": (q + 2 * kv, h),
        "o": (h, q),
        "gate_up": (2 * inter, h),
        "down": (h, inter),
        **({"router": (experts, h)} if experts else {}),
        "lm_head": (vocab, h),
    }


#: the most tokens the random-weight models' tokenizer is trained to (fewer when the corpus runs
#: out of merges), padded with filler words to the shape's vocabulary
TRAINED_TOKENS = 4096


def _holds_shape(out: Path, config: dict[str, Any]) -> bool:
    """Whether ``out`` holds a model built of ``config``'s shape (its config.json has every key of
    the shape's with the same value)."""
    try:
        written = json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(written, dict) and all(written.get(k) == v for k, v in config.items())


def built_before(shape: str, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``out_dir`` holds the model of ``shape`` (and ``dtype``) a build made there before,
    which :func:`build_random_model` keeps rather than writes again."""
    out = Path(out_dir)
    config = dict(SHAPES[shape], torch_dtype=str(dtype).removeprefix("torch."))
    return (out / "model.safetensors.index.json").is_file() and _holds_shape(out, config)


def build_random_model(
    shape: str, out_dir: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.bfloat16,
    shard_bytes: int = 4 << 30, seed: int = 0, overwrite: bool = False,
) -> Path:  # fmt: skip
    """Write ``SHAPES[shape]`` with random weights (std hidden**-0.5, norms near one) to ``out_dir``,
    made with its missing parents, or keep the model of this shape built there before. A folder
    holding anything else is refused (FileExistsError) unless ``overwrite`` (a benchmark's own
    model cache, where a build cut short leaves a part); a build cut short removes what it made."""
    config = dict(SHAPES[shape], torch_dtype=str(dtype).removeprefix("torch."))
    out = Path(out_dir)
    if built_before(shape, out, dtype):
        return out  # (kept)
    if not overwrite and out.is_dir() and any(out.iterdir()):
        # (its config.json and tokenizer were overwritten beside another model's weights, or a
        # folder with another shape's index was taken as built: a real model could be lost)
        raise FileExistsError(
            f"{out} is not empty{' and holds no ' + shape + ' built before' if out.joinpath('config.json').exists() else ''}: "
            "give a new or empty folder"
        )
    if out.exists() and not out.is_dir():  # (it was mkdir's "[Errno 17] File exists: '/dev/null'")
        raise FileExistsError(f"{out} is a file, not a folder: give a new or empty folder")
    gen = torch.Generator(device=device).manual_seed(seed)  # (a bad device fails before any write)
    # the topmost folder made here: ``out`` is made with its missing parents, as ``mkdir -p`` (and
    # transformers' save_pretrained) make them; None: ``out`` was there, empty
    made = next((folder for folder in reversed([out, *out.parents]) if not folder.exists()), None)
    out.mkdir(parents=True, exist_ok=True)
    try:
        _write_random_model(out, config, gen, device, dtype, shard_bytes)
    except BaseException:
        # (a build cut short, by Ctrl-C or a full disk, left a part that the next run refused as
        # "not empty"; a benchmark's own cache, ``overwrite``, is built over instead)
        if not overwrite:
            _remove_written(out, made)
        raise
    return out


def _remove_written(out: Path, made: Path | None) -> None:
    """What a build cut short wrote: the folders it made (``made``, the topmost: --out a/b/c left
    a/b behind), else what it wrote into ``out``, empty before it (nothing else is there)."""
    import shutil

    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        return
    for path in out.iterdir():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _write_random_model(
    out: Path, config: dict[str, Any], gen: torch.Generator, device: str, dtype: torch.dtype, shard_bytes: int
) -> None:
    from safetensors.torch import save_file

    from minisgl_core.demo.factories import pad_vocab, train_tokenizer

    train_tokenizer(out, vocab_size=TRAINED_TOKENS)
    tokens = json.loads((out / "tokenizer.json").read_text())["model"]["vocab"]
    # Every id the model samples must decode to text, or streaming would send almost no chunks.
    pad_vocab(out, config["vocab_size"])
    config |= dict(eos_token_id=tokens["<|im_end|>"], bos_token_id=None)
    std = config["hidden_size"] ** -0.5
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, dims in parameter_shapes(config).items():
        if name.endswith(".bias"):
            t = 0.02 * torch.randn(dims, generator=gen, device=device)
        elif len(dims) == 1:  # norms
            t = 1.0 + 0.05 * torch.randn(dims, generator=gen, device=device)
        else:
            t = torch.randn(dims, generator=gen, device=device) * std
        t = t.to(dtype).cpu()
        if size and size + t.numel() * t.element_size() > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.numel() * t.element_size()
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map |= {name: fname for name in shard}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [config["eos_token_id"]]}))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for s in shards for t in s.values())},
             "weight_map": weight_map}  # fmt: skip
    (out / "model.safetensors.index.json").write_text(json.dumps(index))

"""Writing a Hugging Face model directory (safetensors + byte-level BPE tokenizer) as a GGUF file.

For tests and for the weight-format conformance kit: it writes what llama.cpp's converter writes
(llama.cpp tensor names, the llama architecture's Q/K row permutation, Gemma's norm weights plus
one and its metadata conventions, norms kept in F32, the
tokenizer as a ``gpt2`` token list with merges, the chat template), so reading it back exercises
the same paths a downloaded GGUF does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minisgl_plugin_gguf.metadata import ARCHITECTURES, EXPERTS_OF, GEMMA_ARCHITECTURES
from minisgl_plugin_gguf.names import ROPE_FREQS
from minisgl_plugin_gguf.rope_factors import llama3_divisors

#: tensor types ``gguf.quants.quantize`` can produce (the K-quants it can only read)
WRITABLE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_BLOCK_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.qkv_proj": "attn_qkv",  # phi3's fused tensors
    "mlp.gate_up_proj": "ffn_up",
    # a mixture of experts (qwen3moe): the router, each matrix stacked over the experts
    "mlp.gate": "ffn_gate_inp",
    "mlp.experts.gate_proj": "ffn_gate_exps",
    "mlp.experts.up_proj": "ffn_up_exps",
    "mlp.experts.down_proj": "ffn_down_exps",
}

#: a checkpoint's per-expert tensor, which llama.cpp's converter stacks over the experts
_EXPERT = re.compile(r"(?P<prefix>model\.layers\.\d+\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight")
#: Mixtral's names for the same (``block_sparse_moe``; w1 gate, w3 up, w2 down)
_MIXTRAL = {"block_sparse_moe.": "mlp.", ".w1.weight": ".gate_proj.weight", ".w3.weight": ".up_proj.weight",
            ".w2.weight": ".down_proj.weight"}  # fmt: skip

#: (gguf name, float32 array) -> raw array to store, or None to store it quantized by qtype
EncodeHook = Callable[[str, np.ndarray], "tuple[np.ndarray, Any] | None"]


#: Gemma 2's and 3's four norms a block (gguf's tensor_mapping.py for GEMMA2 and GEMMA3)
_GEMMA2_TO_GGUF = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_ARCH_BLOCK_TO_GGUF = {"gemma2": _GEMMA2_TO_GGUF, "gemma3": _GEMMA2_TO_GGUF}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    if hf_name in _TO_GGUF:
        return _TO_GGUF[hf_name]
    parts = hf_name.split(".")  # model.layers.N.<module...>.weight
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    return f"blk.{layer}.{({**_BLOCK_TO_GGUF, **_ARCH_BLOCK_TO_GGUF.get(arch, {})})[module]}.{kind}"


def permute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter row order for q_proj/k_proj of the llama architecture."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    hf_dir: str | Path,
    out: str | Path,
    qtype: str = "F32",
    *,
    arch: str | None = None,
    encode: EncodeHook | None = None,
) -> Path:
    """Write the model in ``hf_dir`` to the GGUF file ``out``; 2-D weights stored as ``qtype``.

    ``arch`` overrides ``general.architecture`` (to write files of an unsupported one);
    ``encode`` may store a tensor its own way (e.g. K-quant blocks made by a test)."""
    import gguf

    hf_dir, out = Path(hf_dir), Path(out)
    config = json.loads((hf_dir / "config.json").read_text())
    by_class = {**{v: k for k, v in ARCHITECTURES.items()}, **{v: k for k, v in EXPERTS_OF.items()}}
    arch = arch or by_class[config["architectures"][0]]
    quant = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(out), arch)
    _write_config(writer, config, arch)
    _write_tokenizer(writer, hf_dir)
    factors = _llama3_rope_factors(config)
    if factors is not None:  # as llama.cpp's converter stores Llama 3.1's scaling
        custom = encode(ROPE_FREQS, factors) if encode is not None else None
        writer.add_tensor(ROPE_FREQS, factors if custom is None else custom[0])
    permuted = arch == "llama"
    for name, tensor in _stack_experts(_iter_safetensors(hf_dir)):
        if name == "lm_head.weight" and (config.get("tie_word_embeddings") or arch in ("gemma", "gemma2")):
            continue  # (GemmaModel and Gemma2Model skip lm_head: llama.cpp ties their head)
        values = tensor.to(torch.float32).numpy()
        target = gguf_name(name, arch)
        if arch in GEMMA_ARCHITECTURES and name.endswith("norm.weight"):
            # every Gemma norm weight, Gemma 3's q/k norms too, plus one (GemmaModel, Gemma2Model,
            # Gemma3Model.norm_shift), so that llama.cpp's plain RMS norm scales by 1 + weight
            values = values + 1.0
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):  # biases with their rows
            values = permute_qk(values, config["num_attention_heads"])
        elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = permute_qk(values, config["num_key_value_heads"])
        custom = encode(target, values) if encode is not None else None
        if custom is not None:
            raw, raw_type = custom
            writer.add_tensor(target, raw, raw_dtype=raw_type)  # raw: the byte shape
        elif values.ndim in (2, 3) and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(target, gguf.quants.quantize(values, quant), raw_dtype=quant)
        else:
            writer.add_tensor(target, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _write_config(writer: Any, config: dict[str, Any], arch: str = "llama") -> None:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if arch in GEMMA_ARCHITECTURES:
        _write_gemma_config(writer, config, arch, head_dim)
        return
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(_rope(config)["rope_theta"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    if config.get("sliding_window") is not None:
        writer.add_sliding_window(config["sliding_window"])
    experts = config.get("num_experts") or config.get("num_local_experts")  # transformers 5 writes the latter
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if "moe_intermediate_size" in config:  # Mixtral's experts: feed_forward_length
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_file_type(0)
    scaling = _rope(config)
    kind = scaling["rope_type"]
    if kind not in ("default", "llama3"):  # llama3 is a tensor (rope_freqs), the others metadata
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType(kind))
        writer.add_rope_scaling_factor(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])


def _write_gemma_config(writer: Any, config: dict[str, Any], arch: str, head_dim: int) -> None:
    """The metadata convert_hf_to_gguf.py's GemmaModel, Gemma2Model and Gemma3Model write: no rope
    base for Gemma 1 and 2 (llama.cpp's default 10000 applies), Gemma 2's soft-caps and window,
    Gemma 3's full layers' rope base (and scaling), the sliding layers' base where config.json
    nests it by layer type (TextModel's ``rope_freq_base_swa``), a final soft-cap only where set,
    and the window unless ``sliding_window_pattern`` is 1."""
    import gguf

    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config.get("num_key_value_heads", config["num_attention_heads"]))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(0)
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(config["sliding_window"])
    elif arch == "gemma3":
        nested = config.get("rope_parameters") or {}
        full = nested.get("full_attention", nested) if nested else {}
        writer.add_rope_freq_base(full.get("rope_theta", config.get("rope_theta", 1_000_000.0)))
        local = nested.get("sliding_attention", {}).get("rope_theta")
        if local is not None:
            writer.add_rope_freq_base_swa(local)
        scaling = full if nested else (config.get("rope_scaling") or {})
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "linear":
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(scaling["factor"])
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        if config.get("sliding_window_pattern", config.get("_sliding_window_pattern")) != 1:
            writer.add_sliding_window(config["sliding_window"])


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of either config.json layout (transformers 5 nests them, with the theta,
    in ``rope_parameters``), with ``rope_type`` and ``rope_theta`` always present."""
    scaling = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    scaling["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    scaling.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    return scaling


def _llama3_rope_factors(config: dict[str, Any]) -> np.ndarray | None:
    """The ``rope_freqs.weight`` llama.cpp's converter writes for a llama3 ``rope_scaling``."""
    scaling = _rope(config)
    if scaling["rope_type"] != "llama3":
        return None
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    theta = scaling["rope_theta"]
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    divisors = llama3_divisors(
        inv_freq,
        scaling["factor"],
        scaling["low_freq_factor"],
        scaling["high_freq_factor"],
        scaling["original_max_position_embeddings"],
    )
    return divisors.astype(np.float32)


def _write_tokenizer(writer: Any, hf_dir: Path) -> None:
    import gguf

    spec = json.loads((hf_dir / "tokenizer.json").read_text())
    tokenizer_config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    special = {token["content"]: token["id"] for token in spec.get("added_tokens", [])}
    vocab.update(special)
    config = json.loads((hf_dir / "config.json").read_text())
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]  # the model's vocabulary may be padded past the tokenizer's
    types = [gguf.TokenType.UNUSED] * size
    for token, token_id in vocab.items():
        tokens[token_id] = token
        types[token_id] = gguf.TokenType.CONTROL if token in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = tokenizer_config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos["content"]
    if eos in vocab:
        writer.add_eos_token_id(vocab[eos])
    pad = tokenizer_config.get("pad_token")
    if isinstance(pad, dict):
        pad = pad["content"]
    if pad in vocab:
        writer.add_pad_token_id(vocab[pad])
    writer.add_add_bos_token(False)
    if tokenizer_config.get("chat_template"):
        writer.add_chat_template(tokenizer_config["chat_template"])


def _stack_experts(items: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors with each layer's per-expert ``experts.<e>.<proj>.weight`` stacked over the
    experts into ``experts.<proj>.weight`` (``[experts, rows, columns]``), as llama.cpp's converter
    stores them; the rest as they come."""
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in items:
        if ".block_sparse_moe." in name:
            for old, new in _MIXTRAL.items():
                name = name.replace(old, new)
        match = _EXPERT.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        stacks.setdefault(f"{match['prefix']}.{match['proj']}.weight", {})[int(match["expert"])] = tensor
    for name, by_expert in stacks.items():
        yield name, torch.stack([by_expert[e] for e in range(len(by_expert))])


def _iter_safetensors(hf_dir: Path):
    """Every (name, tensor) of the directory's safetensors files (the plugin reads them itself:
    plugins use the stable API only)."""
    from safetensors import safe_open

    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)

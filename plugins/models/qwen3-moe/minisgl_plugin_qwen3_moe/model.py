"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head RMS norm on q and k)
with a mixture-of-experts MLP in the sparse layers (``minisgl_core.layers.moe``) and the dense
SwiGLU MLP of ``intermediate_size`` in the others (``mlp_only_layers``, ``decoder_sparse_step``)."""

from __future__ import annotations

import re
from typing import Any

from minisgl_core.api import ModelConfig
from minisgl_core.layers import DecoderForCausalLM, MLPFactory, SparseMoE
from minisgl_core.layers.moe import expert_target, stacked_expert_target

#: a checkpoint's per-expert tensors: ``<layer>.mlp.experts.<e>.{gate,up,down}_proj.weight``
_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")
#: transformers 5's fused ones: ``<layer>.mlp.experts.gate_up_proj`` and ``.down_proj``
_FUSED_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate_up|down)_proj$")


def num_experts(hf: dict[str, Any]) -> int:
    """config.json's ``num_experts`` (Qwen's checkpoints), ``num_local_experts`` as transformers 5
    writes it."""
    return int(hf.get("num_experts", hf.get("num_local_experts", 0)) or 0)


def sparse_layer(hf: dict[str, Any], layer: int) -> bool:
    """Whether ``layer`` has the experts (transformers' rule): not in ``mlp_only_layers``, experts
    configured, and ``(layer + 1)`` a multiple of ``decoder_sparse_step``."""
    step = int(hf.get("decoder_sparse_step", 1) or 1)
    return layer not in (hf.get("mlp_only_layers") or []) and num_experts(hf) > 0 and (layer + 1) % step == 0


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    qk_norm = True

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        top_k, experts = hf.get("num_experts_per_tok", 8), num_experts(hf)
        if experts > 0 and not (isinstance(top_k, int) and 1 <= top_k <= experts):
            return f"num_experts_per_tok {top_k!r} is not supported (1 to num_experts {experts} is)"
        return super().unsupported_setting(hf, context_len)

    def mlp_factory(self, config: ModelConfig) -> MLPFactory:
        hf = config.hf_config

        def build(layer: int) -> SparseMoE | None:
            if not sparse_layer(hf, layer):
                return None  # the dense MLP of intermediate_size
            return SparseMoE(
                hf["hidden_size"],
                hf["moe_intermediate_size"],
                num_experts(hf),
                hf.get("num_experts_per_tok", 8),
                renormalize=bool(hf.get("norm_topk_prob", False)),
                parallel=config.parallel,
                dtype=config.dtype,
                device=config.device,
            )

        return build

    def checkpoint_target(self, name: str) -> tuple[str, Any]:
        match = _EXPERT.match(name)
        if match is not None:
            return expert_target(match["prefix"], match["proj"], int(match["expert"]))
        stacked = stacked_expert_target(name)  # a GGUF file's
        if stacked is not None:
            return stacked
        match = _FUSED_EXPERTS.match(name)
        if match is not None:
            return f"{match['prefix']}.{'w13' if match['proj'] == 'gate_up' else 'w2'}", "fused"
        return super().checkpoint_target(name)

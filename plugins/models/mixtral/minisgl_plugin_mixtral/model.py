"""Mixtral (Mixtral-8x7B, Mixtral-8x22B): Mistral's attention with a mixture of experts in every
layer (``minisgl_core.layers.SparseMoE``): the router picks ``num_experts_per_tok`` of
``num_local_experts`` SwiGLU experts, their softmax weights renormalised over the chosen ones and
kept in float32 (transformers' Mixtral router)."""

from __future__ import annotations

import re
from typing import Any

from minisgl_core.api import ModelConfig
from minisgl_core.layers import DecoderForCausalLM, MLPFactory, SparseMoE

#: a checkpoint's expert tensors: ``<layer>.block_sparse_moe.experts.<e>.w{1,2,3}.weight``
#: (w1 gate, w3 up, w2 down)
_EXPERT = re.compile(r"^(?P<prefix>.*)\.block_sparse_moe\.experts\.(?P<expert>\d+)\.w(?P<w>[123])\.weight$")
_ROUTER = re.compile(r"^(?P<prefix>.*)\.block_sparse_moe\.gate\.weight$")
#: each matrix stacked over the experts, ``[experts, rows, cols]`` (a GGUF file's
#: ``ffn_{gate,up,down}_exps``, as the gguf plugin names them)
_STACKED = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate|up|down)_proj\.weight$")


class MixtralForCausalLM(DecoderForCausalLM):
    # config.json's sliding_window applies whenever set, as Mistral's (the released Mixtral
    # configs set none: full attention)
    window_when_set = True

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any]) -> str | None:
        top_k, experts = hf.get("num_experts_per_tok", 2), hf.get("num_local_experts", 8)
        if not (isinstance(experts, int) and experts > 0):
            return f"num_local_experts {experts!r} is not supported (a positive number of experts is)"
        if not (isinstance(top_k, int) and 1 <= top_k <= experts):
            return f"num_experts_per_tok {top_k!r} is not supported (1 to num_local_experts {experts} is)"
        return super().unsupported_setting(hf)

    def mlp_factory(self, config: ModelConfig) -> MLPFactory:
        hf = config.hf_config

        def build(layer: int) -> SparseMoE:
            return SparseMoE(
                hf["hidden_size"],
                hf["intermediate_size"],
                hf.get("num_local_experts", 8),
                hf.get("num_experts_per_tok", 2),
                renormalize=True,
                float32_weights=True,
                parallel=config.parallel,
                dtype=config.dtype,
                device=config.device,
            )

        return build

    def checkpoint_target(self, name: str) -> tuple[str, Any]:
        match = _EXPERT.match(name)
        if match is not None:
            prefix, expert, w = match["prefix"], int(match["expert"]), match["w"]
            if w == "2":
                return f"{prefix}.mlp.experts.w2", expert
            return f"{prefix}.mlp.experts.w13", (expert, 0 if w == "1" else 1)
        match = _ROUTER.match(name)
        if match is not None:
            return f"{match['prefix']}.mlp.gate.weight", None
        match = _STACKED.match(name)
        if match is not None:
            prefix, proj = match["prefix"], match["proj"]
            if proj == "down":
                return f"{prefix}.w2", "fused"
            return f"{prefix}.w13", ("stacked", 0 if proj == "gate" else 1)
        return super().checkpoint_target(name)

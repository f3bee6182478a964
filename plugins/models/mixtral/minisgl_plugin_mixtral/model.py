"""Mixtral (Mixtral-8x7B, Mixtral-8x22B): Mistral's attention with a mixture of experts in every
layer (``minisgl_core.layers.SparseMoE``): the router picks ``num_experts_per_tok`` of
``num_local_experts`` SwiGLU experts, their softmax weights renormalised over the chosen ones and
kept in float32 (transformers' Mixtral router)."""

from __future__ import annotations

import re
from typing import Any

from minisgl_core.api import ModelConfig
from minisgl_core.layers import DecoderForCausalLM, MLPFactory, SparseMoE
from minisgl_core.layers.moe import expert_target, stacked_expert_target

#: a checkpoint's expert tensors: ``<layer>.block_sparse_moe.experts.<e>.w{1,2,3}.weight``
#: (w1 gate, w3 up, w2 down)
_EXPERT = re.compile(r"^(?P<prefix>.*)\.block_sparse_moe\.experts\.(?P<expert>\d+)\.w(?P<w>[123])\.weight$")
#: the checkpoint's w1, w3, w2: each expert's gate, up and down projections
_PROJ = {"1": "gate", "3": "up", "2": "down"}
_ROUTER = re.compile(r"^(?P<prefix>.*)\.block_sparse_moe\.gate\.weight$")


class MixtralForCausalLM(DecoderForCausalLM):
    # config.json's sliding_window applies whenever set, as Mistral's (the released Mixtral
    # configs set none: full attention)
    window_when_set = True

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        top_k, experts = hf.get("num_experts_per_tok", 2), hf.get("num_local_experts", 8)
        if not (isinstance(experts, int) and experts > 0):
            return f"num_local_experts {experts!r} is not supported (a positive number of experts is)"
        if not (isinstance(top_k, int) and 1 <= top_k <= experts):
            return f"num_experts_per_tok {top_k!r} is not supported (1 to num_local_experts {experts} is)"
        return super().unsupported_setting(hf, context_len)

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
            return expert_target(f"{match['prefix']}.mlp.experts", _PROJ[match["w"]], int(match["expert"]))
        match = _ROUTER.match(name)
        if match is not None:
            return f"{match['prefix']}.mlp.gate.weight", None
        stacked = stacked_expert_target(name)  # a GGUF file's
        if stacked is not None:
            return stacked
        return super().checkpoint_target(name)

"""IBM Granite 3.x: Llama's decoder with four scalars from config.json, folded into the weights
once they are loaded (before any ``--quantization`` method quantizes them), so the shared decoder
and its fused residual-add norms run unchanged:

- ``embedding_multiplier`` scales the token embeddings: the embedding table is scaled;
- ``residual_multiplier`` scales each attention and MLP output before its residual add: o_proj's
  and down_proj's weights (and biases) are scaled;
- ``logits_scaling`` divides the logits: the final norm's weight is divided by it, and, with tied
  embeddings, by ``embedding_multiplier`` too, since the LM head then reads the scaled table;
- ``attention_multiplier`` is the softmax scale (not ``head_dim ** -0.5``): the KV spec's scale.

Each is a scalar on a whole matrix or vector, so it commutes with the tensor-parallel split: each
rank scales its own shard. A missing key is 1.0, as in transformers' ``GraniteConfig``."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable
from typing import Any

import torch

from minisgl_core.api import KVSpec, ModelConfig
from minisgl_core.layers import DecoderForCausalLM

MULTIPLIER_KEYS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def multipliers(hf: dict[str, Any]) -> tuple[float, float, float, float]:
    """config.json's (embedding_multiplier, residual_multiplier, attention_multiplier,
    logits_scaling), each 1.0 when absent."""
    embedding, residual, attention, logits = (float(hf.get(key, 1.0)) for key in MULTIPLIER_KEYS)
    return embedding, residual, attention, logits


class GraniteForCausalLM(DecoderForCausalLM):
    qk_norm = False

    @classmethod
    def unsupported_setting(cls, hf: dict[str, Any], context_len: int | None = None) -> str | None:
        """The decoder's refusals, and a multiplier that is not a positive number (the logits and,
        tied, the embeddings' are divided by)."""
        for key in MULTIPLIER_KEYS:
            value = hf.get(key, 1.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                return f"{key} {json.dumps(value)} is not supported (a positive number is)"
        return super().unsupported_setting(hf, context_len)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        _, _, attention, _ = multipliers(config.hf_config)
        self._granite_kv_spec = dataclasses.replace(super().kv_spec, scale=attention)

    @property
    def kv_spec(self) -> KVSpec:
        return self._granite_kv_spec

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        used = super().load_weights(weights)  # every parameter is (re)loaded, or this raised
        self._fold_multipliers()
        return used

    @torch.no_grad()
    def _fold_multipliers(self) -> None:
        embedding, residual, _, logits = multipliers(self.config.hf_config)
        final = 1.0 / (logits * embedding) if self.tie_word_embeddings else 1.0 / logits
        scaled = [(self.model.embed_tokens.weight, embedding), (self.model.norm.weight, final)]
        for layer in self.model.layers:
            for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
                scaled += [(p, residual) for p in (proj.weight, proj.bias) if p is not None]
        packed = next((p for p, _ in scaled if not p.is_floating_point() or p.element_size() < 2), None)
        if packed is not None:
            # a method that loads pre-quantized weights (packed integers, float8) would need its
            # scales multiplied instead: refused, before any weight is scaled, rather than
            # computing another model
            raise ValueError(
                f"a weight of dtype {str(packed.dtype).removeprefix('torch.')}: Granite's "
                "multipliers are folded into 16- or 32-bit floating-point weights at load, so "
                "pre-quantized Granite checkpoints are not supported (--quantization methods "
                "quantize after the fold)"
            )
        for param, factor in scaled:
            param.mul_(factor)

"""Rotary position embedding, built from a Hugging Face config (default and llama3 scaling)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from minisgl_core.layers.fused import rotary, rotary_angles


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate_half over the two halves of each head)."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of ``positions``' angles (``[num_tokens, 1, head_dim]``, computed in float32,
        returned in ``dtype``): computed once per forward, they serve every layer (``angles=``)."""
        return rotary_angles(positions, self.inv_freq, dtype)

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        angles: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q``/``k``: [num_tokens, heads, head_dim]; angles in float32, applied in q's dtype
        (``angles``: :meth:`angles` of ``positions`` in q's dtype, else computed here)."""
        return rotary(q, k, positions, self.inv_freq, angles)


def rope_parameters(hf_config: dict[str, Any]) -> dict[str, Any]:
    """Rope settings from either layout: transformers 5 ``rope_parameters`` or older
    ``rope_scaling`` plus a top-level ``rope_theta``. Always has ``rope_type`` and ``rope_theta``."""
    params = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", hf_config.get("rope_theta", 10000.0))
    return params


#: the rope types get_rope builds
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def get_rope(hf_config: dict[str, Any], head_dim: int) -> RotaryEmbedding:
    params = rope_parameters(hf_config)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1 is not supported")
    inv_freq = 1.0 / (
        params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if params["rope_type"] == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, params)
    elif params["rope_type"] == "linear":  # position interpolation: every position divided by factor
        inv_freq = inv_freq / params["factor"]
    elif params["rope_type"] != "default":
        raise NotImplementedError(
            f"rope type {params['rope_type']!r} is not supported (default, linear, llama3 are)"
        )
    return RotaryEmbedding(inv_freq)


def _llama3_inv_freq(inv_freq: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, the band between blended.
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old_context = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, blended, scaled)

"""Tensor-parallel building blocks for model plugins, and the shared decoder built from them.

Every block takes a :class:`~minisgl_core.api.ParallelContext` and allocates only this rank's
shard; it works with tp_size 1 (no torch.distributed needed) and above. Each parameter carries
``weight_loader(param, full_tensor, shard_id=None)`` that copies this rank's shard out of a full
checkpoint tensor, so loading is one code path for any tp_size. :class:`DecoderForCausalLM` is
the Llama-family decoder the model plugins subclass, setting flags only (a mixture-of-experts
model hands it :class:`SparseMoE` blocks through :meth:`DecoderForCausalLM.mlp_factory`).
"""

from minisgl_core.layers.attention import AttentionLayer
from minisgl_core.layers.decoder import (
    DecoderAttention,
    DecoderForCausalLM,
    DecoderLayer,
    DecoderMLP,
    DecoderModel,
    MLPFactory,
)
from minisgl_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from minisgl_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl_core.layers.moe import SparseMoE
from minisgl_core.layers.norm import RMSNorm
from minisgl_core.layers.rotary import RotaryEmbedding, get_rope, rope_parameters
from minisgl_core.layers.weights import WeightLoader, load_full

__all__ = [
    "AttentionLayer",
    "DecoderAttention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderMLP",
    "DecoderModel",
    "MLPFactory",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "SparseMoE",
    "VocabParallelEmbedding",
    "WeightLoader",
    "get_rope",
    "load_full",
    "rope_parameters",
]

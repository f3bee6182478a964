"""The 1.x home of the model layers, kept importable through API 2.0 only.

The tensor-parallel blocks, the shared decoder and the kernels moved to :mod:`minisgl_core.layers`
in API 2.0: plugins may use them, but the stable API no longer promises them (a kernel change is
no API change). ``from minisgl_core.api.layers import X`` and ``from minisgl_core.api.layers.fused
import X`` still return the same objects, with a :class:`MinisglDeprecationWarning` naming the
importing module, its distribution and the import to use instead. Removed in API 2.1.
"""

from __future__ import annotations

from minisgl_core.api.deprecation import moved_module

#: the names 1.x exported here (what ``import *`` gives); served by ``__getattr__``, so not defined
__all__ = [  # noqa: F822
    "AttentionLayer",
    "DecoderAttention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderMLP",
    "DecoderModel",
    "MergedColumnParallelLinear",
    "ParallelLMHead",
    "QKVParallelLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "WeightLoader",
    "get_rope",
    "load_full",
    "rope_parameters",
]

__getattr__ = moved_module(
    globals(),
    "minisgl_core.layers",
    since="2.0",
    submodules=(
        "attention",
        "decoder",
        "embedding",
        "fused",
        "linear",
        "norm",
        "rotary",
        "triton_ops",
        "weights",
    ),
)

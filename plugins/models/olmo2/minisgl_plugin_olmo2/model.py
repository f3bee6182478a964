"""AllenAI OLMo 2: the shared Llama-family decoder with two changes.

- Its norms follow each branch instead of preceding it: a layer is ``h = x + norm(attn(x))`` then
  ``h + norm(mlp(h))`` (``post_attention_layernorm``, ``post_feedforward_layernorm``); there is no
  input norm. The model's final norm is Llama's.
- ``q_norm`` and ``k_norm`` are RMS norms over the whole q and k projections (``num_heads *
  head_dim`` and ``num_kv_heads * head_dim`` values), not over each head as Qwen3's are. Under
  tensor parallelism a rank holds only its heads' part of each vector, so the ranks all-reduce
  their sums of squares (q's and k's, one small all-reduce a layer) before dividing; each rank
  keeps the slice of the norm weights that matches its heads.

The MLP has no bias whatever config.json says (transformers' ``Olmo2MLP`` has none);
``attention_bias`` gives the four attention projections one, as for Llama."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minisgl_core.api import ForwardBatch, ParallelContext
from minisgl_core.layers import DecoderAttention, DecoderForCausalLM, DecoderMLP, RMSNorm
from minisgl_core.layers.decoder import Angles
from minisgl_core.layers.weights import copy_rows, new_param


class ShardedVectorNorm(nn.Module):
    """The weight of an RMS norm over a vector of ``full_size`` values of which this rank holds
    ``local_size`` starting at ``start`` (its heads' part of a projection); the norm itself is
    :meth:`Olmo2Attention.project_qkv`'s, which needs both q's and k's sums at once."""

    def __init__(
        self,
        full_size: int,
        local_size: int,
        start: int,
        eps: float,
        *,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__()
        self.full_size, self.start, self.eps = full_size, start, eps
        self.weight = new_param((local_size,), dtype, device, self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        copy_rows(param.data, loaded, self.start, self.full_size)


class Olmo2Attention(DecoderAttention):
    """The decoder's attention with q and k each normalized over the whole projection (all heads,
    all ranks) before rotary."""

    def __init__(
        self,
        hf: dict[str, Any],
        layer_id: int,
        *,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__(hf, layer_id, qk_norm=False, parallel=parallel, dtype=dtype, device=device)
        head_dim, tp_size, rank = self.attn.head_dim, parallel.tp_size, parallel.tp_rank
        num_heads = hf["num_attention_heads"]
        num_kv_heads = hf.get("num_key_value_heads") or num_heads
        local_heads, local_kv_heads = self.attn.num_heads, self.attn.num_kv_heads
        # (as QKVParallelLinear shards k: by heads, or one KV head a rank when there are fewer
        # KV heads than ranks)
        kv_start = rank * local_kv_heads if num_kv_heads >= tp_size else rank * num_kv_heads // tp_size
        eps = hf.get("rms_norm_eps", 1e-6)
        self.q_norm = ShardedVectorNorm(
            num_heads * head_dim, local_heads * head_dim, rank * local_heads * head_dim, eps,
            dtype=dtype, device=device,
        )  # fmt: skip
        self.k_norm = ShardedVectorNorm(
            num_kv_heads * head_dim, local_kv_heads * head_dim, kv_start * head_dim, eps,
            dtype=dtype, device=device,
        )  # fmt: skip
        self.parallel = parallel
        # What the all-reduced sums cover: every rank's part, so each KV head held by several
        # ranks (fewer KV heads than ranks) is counted as many times as it is held, which the
        # count divides out again.
        self.q_count = local_heads * head_dim * tp_size
        self.k_count = local_kv_heads * head_dim * tp_size

    def project_qkv(self, hidden: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q, k, v = qkv.split(self.qkv_proj.output_sizes, dim=-1)
        q32, k32 = q.float(), k.float()
        squares = torch.stack((q32.square().sum(-1), k32.square().sum(-1)), dim=-1)
        squares = self.parallel.all_reduce(squares)  # the whole vectors' sums, on every rank
        eps = self.q_norm.eps
        q_scale = torch.rsqrt(squares[:, :1] / self.q_count + eps)
        k_scale = torch.rsqrt(squares[:, 1:] / self.k_count + eps)
        # the weight applied in float32, then rounded, as transformers' Olmo2RMSNorm does
        q = (self.q_norm.weight * (q32 * q_scale)).to(qkv.dtype)
        k = (self.k_norm.weight * (k32 * k_scale)).to(qkv.dtype)
        return torch.cat((q, k, v), dim=-1).view(hidden.shape[0], -1, self.attn.head_dim)


class Olmo2DecoderLayer(nn.Module):
    """``h = x + norm(attn(x))``, then ``h + norm(mlp(h))``; built and called as the decoder's
    ``DecoderLayer`` (see ``DecoderForCausalLM.layer_cls``): it takes and returns (branch output,
    residual stream), so that the last layer's final add is the model's final norm's."""

    #: each branch is summed across ranks before its norm: the output is never a partial sum
    defers_sums = False

    def __init__(
        self,
        hf: dict[str, Any],
        layer_id: int,
        *,
        qk_norm: bool,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
        qkv_bias: bool = False,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        eps, hidden = hf.get("rms_norm_eps", 1e-6), hf["hidden_size"]
        self.self_attn = Olmo2Attention(hf, layer_id, parallel=parallel, dtype=dtype, device=device)
        self.mlp = mlp or DecoderMLP({**hf, "mlp_bias": False}, parallel=parallel, dtype=dtype, device=device)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype=dtype, device=device)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, dtype=dtype, device=device)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        batch: ForwardBatch,
        angles: Angles | None = None,
        *,
        hidden_is_partial: bool = False,
        reduce_output: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's normalized MLP output, the residual stream it is to be added to).
        ``hidden_is_partial`` and ``reduce_output`` are never set: see :attr:`defers_sums`."""
        stream = hidden if residual is None else hidden + residual
        stream = stream + self.post_attention_layernorm(self.self_attn(stream, batch, angles))
        return self.post_feedforward_layernorm(self.mlp(stream)), stream


class Olmo2ForCausalLM(DecoderForCausalLM):
    qk_norm = False  # (the whole-vector q/k norms are Olmo2Attention's own)
    layer_cls = Olmo2DecoderLayer

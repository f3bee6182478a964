"""Vocabulary-parallel input embedding and output head."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api.parallel import ParallelContext
from minisgl_core.layers import triton_ops
from minisgl_core.layers.linear import (
    CPU_SLAB_ROWS,
    cpu_onednn,
    cpu_slabs,
    onednn_linear,
    slab_matmul,
    slab_products_pay,
)
from minisgl_core.layers.weights import new_param

#: most rows the output head multiplies in slabs on a CPU (:func:`~minisgl_core.layers.linear.cpu_slabs`):
#: 1.1-5.8x F.linear up to 32 rows of a 49,152 x 576 float32 head, slower from 64 (2 cores); where
#: oneDNN's linear serves it (:func:`~minisgl_core.layers.linear.cpu_onednn`) that takes 5 rows
#: and up (1.2-1.7x the slabs from 5 to 64 rows of that head), the slabs keep 1-4
CPU_SLAB_HEAD_ROWS = 32


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows; the vocabulary is padded to a multiple of tp_size."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        parallel: ParallelContext,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.parallel = parallel
        self.rows_per_rank = math.ceil(num_embeddings / parallel.tp_size)
        self.vocab_start = parallel.tp_rank * self.rows_per_rank
        self.weight = new_param((self.rows_per_rank, embedding_dim), dtype, device, self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        if loaded.shape != (self.num_embeddings, param.shape[1]):
            raise ValueError(
                f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit a vocabulary of "
                f"{self.num_embeddings} x {param.shape[1]}"
            )
        shard = loaded[self.vocab_start : self.vocab_start + self.rows_per_rank]
        param.data.zero_()  # padding rows past the true vocabulary stay zero
        param.data[: shard.shape[0]].copy_(shard)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside[:, None], 0)
        return self.parallel.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Output projection split by vocabulary rows; logits are gathered and trimmed to the true
    vocab, unless the model runner turned :attr:`gather_output` off (it then samples each rank's
    slice where it can: ``Sampler.sample_sharded``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: a --quantization method that set ``quantizes_lm_head`` (see api/quantization.py)
        self.quant_method: Any = None
        #: False: return this rank's ``[n, rows_per_rank]`` slice, padding columns included
        self.gather_output = True

    @property
    def valid_rows(self) -> int:
        """How many of this rank's rows are true vocabulary (the last rank's may be padding)."""
        return max(0, min(self.rows_per_rank, self.num_embeddings - self.vocab_start))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        onednn = cpu_onednn(hidden, self.weight)  # from 5 rows; the slabs keep 1-4 where it serves
        if self.quant_method is not None:
            logits = self.quant_method.apply(self, hidden)
        elif triton_ops.small_gemm_enabled(hidden, self.weight):
            logits = triton_ops.small_gemm(hidden, self.weight)
        elif slabs := cpu_slabs(
            hidden, self.weight, max_rows=CPU_SLAB_ROWS if onednn else CPU_SLAB_HEAD_ROWS
        ):
            logits = slab_matmul(hidden, self.weight, slabs)
        elif onednn:
            logits = onednn_linear(hidden, self.weight)
        elif (
            hidden.is_cuda
            or hidden.shape[0] == 1
            or hidden.shape[0] > CPU_SLAB_HEAD_ROWS
            or not slab_products_pay()
        ):
            logits = F.linear(hidden, self.weight)
        else:
            # On an AMD CPU under MKL, ``weight @ hidden.T`` (each vocabulary row read once, dotted
            # with every row of hidden) runs 1.5-3x faster than F.linear for a few rows (2 AVX2
            # cores, 49,152 x 576, 8 rows: 32 ms against 50-99 ms; on an Intel Xeon up to 2.9x slower
            # at 2-4 rows); the same dot products. Where the slabs above do not serve it (another dtype,
            # the fast path off).
            logits = (self.weight @ hidden.T).T.contiguous()
        if not self.gather_output:
            return logits
        logits = self.parallel.all_gather(logits, dim=-1)
        return logits[:, : self.num_embeddings]

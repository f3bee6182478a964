"""Tensor-parallel linear layers: fused column-parallel (q/k/v, gate/up) and row-parallel."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core import fast_paths
from minisgl_core.api.parallel import ParallelContext, _fast_all_reduce
from minisgl_core.layers import triton_ops
from minisgl_core.layers.weights import WeightLoader, copy_rows, copy_shard, load_full, new_param

#: most rows of a linear layer's product a CPU runs as slabs (:func:`cpu_slabs`): at four rows the
#: slabs were 1.1-2.6x faster on 2 threads, from five on about even or slower than ``F.linear``
#: (SmolLM2-135M's and Qwen3-0.6B's shapes, ``tools/cpu_gemm.py``; BENCHMARKS.md)
CPU_SLAB_ROWS = 4


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The CPU's ``vendor_id`` (``AuthenticAMD``, ``GenuineIntel``...) from Linux's ``cpuinfo``, or
    None where there is none (another OS, another architecture)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    return value.strip()
    except OSError:
        return None
    return None


@functools.cache
def slab_products_pay() -> bool:
    """Whether this CPU is one the slab product was measured faster on: an AMD processor with
    torch's BLAS being MKL, which runs products of a few float32 rows slowly there (the 2-core EPYC
    dev machine: slabs 1.1-2.9x ``F.linear`` at 1-4 rows). On an Intel Xeon (16 cores, MKL 2024.2,
    1 to 16 threads) ``F.linear`` was 1.7-2.8x faster than the slabs at one row, so elsewhere it
    stays (BENCHMARKS.md, "CPU")."""
    return torch.backends.mkl.is_available() and cpu_vendor() == "AuthenticAMD"


def _slow_mkl_float32_product(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` is a float32 product on a CPU where MKL's ``F.linear`` is slow
    (:func:`slab_products_pay`): a 2-D ``x`` of one row or more, a contiguous 2-D weight. What
    both CPU paths here (:func:`cpu_slabs`, :func:`cpu_onednn`) serve."""
    return (
        x.device.type == "cpu"
        and x.dim() == 2
        and x.shape[0] >= 1
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and weight.is_contiguous()
        and slab_products_pay()
    )


def cpu_slabs(x: torch.Tensor, weight: torch.Tensor, max_rows: int = CPU_SLAB_ROWS) -> int:
    """How many slabs :func:`slab_matmul` cuts ``weight`` into for ``x @ weight.T`` on a CPU, or 0
    where another product serves it (fast path ``cpu_slab_gemm``): float32 ``x`` of 1 to ``max_rows``
    rows and a contiguous float32 weight, in the largest number of slabs dividing its output rows
    from 2 up to the intra-op threads.

    Only on the CPUs where it was measured to pay (:func:`slab_products_pay`): there ``F.linear``
    of a few rows read a float32 weight at a third of the machine's bandwidth (10-12 GB/s against
    34 on the 2-core AMD dev machine, one thread or two), where a batched product over slabs of the
    weight's rows reads it at nearly all of it; half precision goes through other kernels, which
    are not slow there."""
    if not (
        _slow_mkl_float32_product(x, weight)
        and x.shape[0] <= max_rows
        and fast_paths.current().enabled("cpu_slab_gemm")
    ):
        return 0
    n = weight.shape[0]
    return next((s for s in range(max(2, torch.get_num_threads()), 1, -1) if n % s == 0), 0)


@functools.cache
def _onednn_linear_op() -> Any:
    """oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``), or None in a build without it."""
    if not torch.backends.mkldnn.is_available():
        return None
    return getattr(torch.ops.mkldnn, "_linear_pointwise", None)


def cpu_onednn(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` runs as oneDNN's linear (:func:`onednn_linear`, fast path
    ``cpu_onednn_gemm``): float32 ``x`` of one row or more on a CPU, a contiguous float32 weight,
    on the CPUs where MKL's ``F.linear`` is slow (:func:`slab_products_pay`). On the 2-core AMD
    dev machine oneDNN's kernels read the weight 1.2-2x faster than ``F.linear`` from 5 to 64 rows
    (SmolLM2-135M's and Qwen3-0.6B's layers, ``tools/cpu_gemm.py``) and run 1.1-1.5x faster at
    256-2,048 rows (prefill); the slabs stay faster at 1-4 rows (BENCHMARKS.md, "CPU")."""
    return (
        _slow_mkl_float32_product(x, weight)
        and fast_paths.current().enabled("cpu_onednn_gemm")
        and _onednn_linear_op() is not None
    )


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN's own kernels (see :func:`cpu_onednn`)."""
    return _onednn_linear_op()(x, weight, bias, "none", [], "")


def slab_matmul(x: torch.Tensor, weight: torch.Tensor, slabs: int) -> torch.Tensor:
    """``x @ weight.T`` as one batched product over ``slabs`` equal slabs of ``weight``'s rows: each
    output is still one dot product over all of K, so the slab count changes no sum."""
    n, k = weight.shape
    rows = x.shape[0]
    out = torch.bmm(weight.view(slabs, n // slabs, k), x.t().expand(slabs, k, rows))
    return out.view(n, rows).t().contiguous()


class _Linear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        loader: WeightLoader,
        bias_loader: WeightLoader,
        dtype: torch.dtype | None,
        device: Any,
        shard_ids: tuple[Any, ...] = (None,),
    ) -> None:
        super().__init__()
        self.weight = new_param((out_features, in_features), dtype, device, loader, shard_ids)
        self.bias = new_param((out_features,), dtype, device, bias_loader, shard_ids) if bias else None
        #: the --quantization method that owns the weight (set by the runner; see api/quantization.py)
        self.quant_method: Any = None

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_method is not None:
            return self.quant_method.apply(self, x)
        if triton_ops.small_gemm_enabled(x, self.weight):
            return triton_ops.small_gemm(x, self.weight)
        slabs = cpu_slabs(x, self.weight)
        if slabs:
            return slab_matmul(x, self.weight, slabs)
        if cpu_onednn(x, self.weight):
            return onednn_linear(x, self.weight)
        return F.linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_method is None and self.bias is not None:
            slabs = cpu_slabs(x, self.weight)  # asked once: _matmul would ask again
            if slabs:
                return slab_matmul(x, self.weight, slabs) + self.bias
            if cpu_onednn(x, self.weight):
                return onednn_linear(x, self.weight, self.bias)
            return F.linear(x, self.weight, self.bias)
        out = self._matmul(x)
        return out if self.bias is None else out + self.bias


class MergedColumnParallelLinear(_Linear):
    """Several column-parallel outputs fused in one matmul (gate_up); shard_id = index of the part."""

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        *,
        parallel: ParallelContext,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        self.parallel = parallel
        self.local_sizes = [parallel.shard(size, "output size") for size in output_sizes]
        super().__init__(
            in_features,
            sum(self.local_sizes),
            bias,
            self._load,
            self._load,
            dtype,
            device,
            shard_ids=tuple(range(len(output_sizes))),
        )

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        size = self.local_sizes[shard_id]
        offset = sum(self.local_sizes[:shard_id])
        dest = param.data.narrow(0, offset, size)
        copy_rows(dest, loaded, self.parallel.tp_rank * size, size * self.parallel.tp_size)


class QKVParallelLinear(_Linear):
    """Fused q/k/v projection sharded by heads (shard_id "q", "k" or "v").

    When there are fewer KV heads than ranks, each rank keeps the one KV head its query heads use."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        parallel: ParallelContext,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        self.parallel = parallel
        self.head_dim = head_dim
        self.num_heads = parallel.shard(num_heads, "num_attention_heads")
        if num_kv_heads >= parallel.tp_size:
            self.num_kv_heads = parallel.shard(num_kv_heads, "num_key_value_heads")
            kv_head_start = parallel.tp_rank * self.num_kv_heads
        elif parallel.tp_size % num_kv_heads == 0:
            self.num_kv_heads = 1
            kv_head_start = parallel.tp_rank * num_kv_heads // parallel.tp_size
        else:
            raise ValueError(
                f"tp_size={parallel.tp_size} is not a multiple of num_key_value_heads={num_kv_heads}"
            )
        q_size, kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        # shard_id -> (offset in this rank's output, rows here, first row in the full tensor, full rows)
        self._parts = {
            "q": (0, q_size, parallel.tp_rank * q_size, num_heads * head_dim),
            "k": (q_size, kv_size, kv_head_start * head_dim, num_kv_heads * head_dim),
            "v": (q_size + kv_size, kv_size, kv_head_start * head_dim, num_kv_heads * head_dim),
        }
        self.output_sizes = [q_size, kv_size, kv_size]
        super().__init__(
            hidden_size,
            q_size + 2 * kv_size,
            bias,
            self._load,
            self._load,
            dtype,
            device,
            shard_ids=("q", "k", "v"),
        )

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        offset, size, start, full_rows = self._parts[shard_id]
        copy_rows(param.data.narrow(0, offset, size), loaded, start, full_rows)


class RowParallelLinear(_Linear):
    """Input features sharded; partial outputs are summed across ranks, then the bias is added once."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        parallel: ParallelContext,
        bias: bool = False,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        self.parallel = parallel
        self.in_local = parallel.shard(in_features, "input size")
        super().__init__(self.in_local, out_features, bias, self._load, load_full, dtype, device)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
        if loaded.dim() != 2 or loaded.shape[1] != self.in_local * self.parallel.tp_size:
            raise ValueError(
                f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit: expected "
                f"{self.in_local * self.parallel.tp_size} input features"
            )
        copy_shard(param, loaded.narrow(1, self.parallel.tp_rank * self.in_local, self.in_local))

    def forward(self, x: torch.Tensor, reduce: bool = True, *, split_k: bool = False) -> torch.Tensor:
        """The output, summed across ranks; with ``reduce=False`` (no bias only) this rank's partial
        sum, for a caller that all-reduces it itself (``RMSNorm(..., partial_of=)``). ``split_k``
        (with ``reduce=False``, for a caller whose next step is that norm): on one GPU the result
        may be a split-K GEMM's partials not yet added (``triton_ops.SplitKPartials``), which only
        that norm takes."""
        if not reduce:
            if self.bias is not None:
                raise ValueError("RowParallelLinear(reduce=False) has no bias to add after the sum")
            if (
                split_k
                and self.parallel.tp_size == 1
                and self.quant_method is None
                and triton_ops.small_gemm_enabled(x, self.weight)
                and triton_ops.split_k_norm_enabled(x.device)
            ):
                # one GPU: a split-K GEMM's partial sums, left to the norm after it (RMSNorm adds
                # them with the residual), one kernel fewer
                return triton_ops.small_gemm_partials(x, self.weight)  # type: ignore[return-value]
            if self.quant_method is None and x.dim() == 2 and self.parallel.tp_size > 1:
                # straight into the buffer the fused all-reduce + norm reads it from, if it will
                fast = _fast_all_reduce.get(id(self.parallel.group))
                claim = getattr(fast, "norm_input", None)
                out = claim(x.shape[0], self.weight.shape[0], x.dtype) if claim is not None else None
                if out is not None:
                    return torch.mm(x, self.weight.t(), out=out)
            return self._matmul(x)
        out = self.parallel.all_reduce(self._matmul(x))
        return out if self.bias is None else out + self.bias

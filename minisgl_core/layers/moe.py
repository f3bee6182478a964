"""A sparse mixture-of-experts MLP: a router picks ``top_k`` of ``num_experts`` SwiGLU experts per
token and the block returns their outputs weighted by the router's probabilities (Qwen3-MoE,
Qwen2-MoE without the shared expert, Mixtral).

Tensor parallelism splits every expert's intermediate size across the ranks, as the dense MLP
does (gate/up by output rows, down by input columns); the router is replicated. Each rank then
returns its partial sum, which the norm after the block all-reduces (``reduce=False``) as it does
for the dense MLP.

The experts' weights are two 3-D parameters: ``w13`` ``[experts, 2 * inter, hidden]`` (gate rows,
then up rows) and ``w2`` ``[experts, hidden, inter]``, loaded from a checkpoint's per-expert tensors
(``experts.<e>.gate_proj.weight`` ...) or transformers 5's fused ones (``experts.gate_up_proj``,
``experts.down_proj``). On CUDA the experts run as two grouped GEMMs in Triton
(:mod:`minisgl_core.layers._triton_moe`): tokens sorted by expert into blocks, one weight matrix
a block, no host synchronisation, so the block captures into CUDA graphs. Elsewhere a loop over
the experts that have tokens computes the same (:func:`experts_reference`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core import fast_paths
from minisgl_core.api.parallel import ParallelContext
from minisgl_core.layers import e4m3, triton_ops
from minisgl_core.layers.fused import silu_and_mul
from minisgl_core.layers.weights import copy_shard, load_full, new_param

#: every expert's matrix stacked, ``<layer>.mlp.experts.{gate,up,down}_proj.weight``
#: (``[experts, rows, columns]``: a GGUF file's ``ffn_{gate,up,down}_exps``, as the gguf plugin names them)
_STACKED_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate|up|down)_proj\.weight$")


def expert_target(prefix: str, proj: str, expert: int | None = None) -> tuple[str, Any]:
    """(parameter name, shard id) a checkpoint's expert matrix loads into, for a model's
    ``checkpoint_target``: ``proj`` ("gate", "up" or "down") of expert ``expert``, or of every
    expert stacked (None), in the block whose :class:`Experts` module is named ``prefix``."""
    if proj == "down":
        return f"{prefix}.w2", "fused" if expert is None else expert
    part = 0 if proj == "gate" else 1
    return f"{prefix}.w13", ("stacked", part) if expert is None else (expert, part)


def stacked_expert_target(name: str) -> tuple[str, Any] | None:
    """:func:`expert_target` of a stacked tensor's name (see ``_STACKED_EXPERTS``), else None."""
    match = _STACKED_EXPERTS.match(name)
    return None if match is None else expert_target(match["prefix"], match["proj"])


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, float32_weights: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids), ``[tokens, top_k]`` each, of router ``logits``: softmax over the
    experts in float32, the ``top_k`` largest, divided by their sum when ``renormalize``
    (``norm_topk_prob``), rounded to the logits' dtype (transformers' Qwen3-MoE router) unless
    ``float32_weights`` (its Mixtral router keeps them in float32)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if float32_weights else weights.to(logits.dtype)), ids


#: the dtypes quantized expert weights may have (:class:`Experts`): each value is exact in every
#: run dtype, so the products multiply the run-dtype activations by the values themselves
QUANTIZED_EXPERT_DTYPES = (torch.float8_e4m3fn, torch.int8)


def quantize_stack(
    weight: torch.Tensor,
    quantize_rows: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A stack of expert matrices ``[experts, rows, cols]`` quantized one expert at a time (a
    float32 copy of one expert's matrix at most) by ``quantize_rows`` (a matrix to its ``dtype``
    values and a scale per row): ``(values, float32 scales [experts, rows])``, what a
    ``QuantizationMethod.quantize_experts`` returns."""
    values = torch.empty(weight.shape, dtype=dtype, device=weight.device)
    scales = torch.empty(weight.shape[:2], dtype=torch.float32, device=weight.device)
    for expert in range(weight.shape[0]):
        q, scale = quantize_rows(weight[expert])
        values[expert], scales[expert] = q, scale.reshape(-1)
    return values, scales


def _expert_product(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T`` for one expert's matrix; quantized (``scale`` given): the values' products
    summed in float32, each column times its scale, rounded once to ``x``'s dtype (the grouped
    GEMM's arithmetic). e4m3 weights multiply e4m3 rows (:data:`W8A8_EXPERTS`): each row of ``x``
    quantized with its own scale (:func:`~minisgl_core.layers.e4m3.quantize_rows`), applied after
    the column's."""
    if scale is None:
        return F.linear(x, w)
    if w.dtype == e4m3.FP8 and W8A8_EXPERTS:
        xq, x_scale = e4m3.quantize_rows(x)
        return (F.linear(xq.float(), w.float()) * scale * x_scale).to(x.dtype)
    return (F.linear(x.float(), w.float()) * scale).to(x.dtype)


def experts_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` with ``expert_e(x) = w2[e] @ (silu(g) * u)``,
    ``[g; u] = w13[e] @ x``: one pair of products per expert that has tokens. ``scales``: the
    weights are quantized (:class:`Experts`), ``(w13 scales, w2 scales)``. It reads the experts'
    token counts on the host (a synchronisation): the CPU's path and the GPU kernels' reference."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "the mixture-of-experts loop reads the experts' token counts on the host and cannot be "
            "captured into a CUDA graph: leave MINISGL_TRITON_MOE on, or turn the graphs off "
            "(--cuda-graph-max-bs 0 --piecewise-cuda-graph-max-tokens 0)"
        )
    tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        pairs = order[start : start + count]
        start += count
        rows = pairs // top_k
        s13, s2 = (None, None) if scales is None else (scales[0][expert], scales[1][expert])
        gate_up = _expert_product(x.index_select(0, rows), w13[expert], s13)
        gate, up = gate_up.chunk(2, dim=-1)
        y = _expert_product(F.silu(gate) * up, w2[expert], s2)
        y = y * weights.reshape(-1).index_select(0, pairs).unsqueeze(1)
        out.index_add_(0, rows, y.to(out.dtype))
    return out


def moe_enabled(x: torch.Tensor) -> bool:
    """Whether the experts run as the Triton grouped GEMMs (:func:`experts_grouped`): on CUDA, or
    under Triton's interpreter (the tests), unless ``MINISGL_TRITON_MOE=0``."""
    return triton_ops.triton_enabled(x.device, "MINISGL_TRITON_MOE")


def block_rows(pairs: int, num_experts: int) -> int:
    """Rows of a grouped GEMM block, 16 to 128, from the pairs an expert gets on average: a decode
    step's few pairs an expert waste less of small blocks, a prefill step's many fill big ones
    (the fastest block size at each step size in a sweep on one H200, ``tools/device_moe.py``)."""
    per_expert = pairs / max(1, num_experts)
    return 16 if per_expert <= 8 else 32 if per_expert <= 48 else 64 if per_expert <= 256 else 128


def align_blocks(ids: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped GEMMs' schedule of (token, choice) pairs, built on the device with shapes known
    from ``ids.shape`` alone (no synchronisation, so CUDA graphs can capture it):

    - ``sorted_pairs`` ``[blocks * block]``: pair indices (``token * top_k + choice``) grouped by
      expert, each expert's run padded to a multiple of ``block`` with ``pairs`` (no pair);
    - ``block_expert`` ``[blocks]``: each block's expert, ``num_experts`` for the blocks past the
      last expert's run (enough blocks are allocated for the worst case).

    Where the experts run in Triton (:func:`moe_enabled`), three small kernels build it
    (``_triton_moe.align``: a run's pairs then in the order its atomic counter took them, which
    changes no output row); elsewhere torch ops in a stable order.
    """
    flat = ids.reshape(-1)
    pairs = flat.numel()
    blocks = -(-(pairs + min(num_experts, pairs) * (block - 1)) // block)
    if moe_enabled(ids):
        from minisgl_core.layers import _triton_moe

        return _triton_moe.align(ids, num_experts, block, blocks)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    padded_end = torch.cumsum(padded, 0)
    starts = padded_end - padded
    first = torch.cumsum(counts, 0) - counts  # each expert's first index in the sorted pairs
    order = torch.argsort(flat, stable=True)
    expert_of = flat.index_select(0, order)
    dest = (
        starts.index_select(0, expert_of)
        + torch.arange(pairs, device=ids.device)
        - first.index_select(0, expert_of)
    )
    sorted_pairs = torch.full((blocks * block,), pairs, dtype=torch.int64, device=ids.device)
    sorted_pairs.scatter_(0, dest, order)
    block_starts = torch.arange(blocks, device=ids.device) * block
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    return sorted_pairs, block_expert


#: SiLU·mul inside the gate/up grouped GEMM (its ``gated`` launch) rather than a kernel after it:
#: one kernel and one ``[pairs, 2 * inter]`` write and read fewer a layer. On one H200 at
#: Qwen3-30B-A3B's shape (BENCHMARKS.md): bf16 gate/up 2-4% faster fused at 64 and 256 tokens
#: (``python3 tools/device_moe.py --gemms``); with ``--quantization fp8`` offline 7,792 tok/s fused
#: (a fresh machine's first run) against 7,714 unfused (the next process)
FUSED_GATE_UP = True
#: e4m3 experts multiply e4m3 activations (W8A8: each GEMM's input rows quantized first, one
#: scale a row, then the FP8 tensor cores) rather than converting the weights to the run dtype in
#: the kernel (weight-only). The loop (:func:`experts_reference`) follows it.
W8A8_EXPERTS = True


def experts_grouped(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    block: int | None = None,
    configs: tuple[tuple[int, int, int, int], tuple[int, int, int, int]] | None = None,
    sum_rows: bool = True,
) -> torch.Tensor:
    """What :func:`experts_reference` computes, as two grouped GEMMs (Triton): gate/up for every
    (token, choice) pair, SiLU·mul, down scaled by the pair's weight, then each token's ``top_k``
    rows summed (:data:`FUSED_GATE_UP`: SiLU·mul in the gate/up GEMM; ``scales`` as there).
    ``block`` and ``configs`` (the two GEMMs' launch) replace :func:`block_rows` and the kernel's
    own choice (``tools/device_moe.py`` sweeps them). ``sum_rows=False``: each token's ``top_k``
    rows not summed, ``[tokens, top_k, hidden]``."""
    from minisgl_core.layers import _triton_moe

    tokens, top_k = ids.shape
    if tokens == 0:  # nothing to launch (a grid of no blocks)
        return x.new_zeros(0, w2.shape[1]) if sum_rows else x.new_zeros(0, top_k, w2.shape[1])
    num_experts = w13.shape[0]
    pairs = tokens * top_k
    block = block or block_rows(pairs, num_experts)
    first, second = configs or (None, None)
    s13, s2 = (None, None) if scales is None else scales
    sorted_pairs, block_expert = align_blocks(ids, num_experts, block)
    w8a8 = w13.dtype == e4m3.FP8 and W8A8_EXPERTS
    a, a_scale = _gemm_input(x, w8a8)
    if FUSED_GATE_UP:
        act = _triton_moe.grouped_gemm(
            a, w13, sorted_pairs, block_expert, pairs, block, row_div=top_k, gated=True, w_scale=s13,
            a_scale=a_scale, out_dtype=x.dtype, config=first,
        )  # fmt: skip
    else:
        gate_up = _triton_moe.grouped_gemm(
            a, w13, sorted_pairs, block_expert, pairs, block, row_div=top_k, w_scale=s13, a_scale=a_scale,
            out_dtype=x.dtype, config=first,
        )  # fmt: skip
        act = silu_and_mul(gate_up)
    a, a_scale = _gemm_input(act, w8a8)
    out = _triton_moe.grouped_gemm(
        a, w2, sorted_pairs, block_expert, pairs, block, row_div=1, scale=weights.reshape(-1), w_scale=s2,
        a_scale=a_scale, out_dtype=x.dtype, config=second,
    )  # fmt: skip
    out = out.view(tokens, top_k, -1)
    return out.sum(dim=1) if sum_rows else out


def _gemm_input(x: torch.Tensor, w8a8: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A grouped GEMM's input rows: as they are, or (``w8a8``) e4m3 with a scale each, the same
    bits as :func:`~minisgl_core.layers.e4m3.quantize_rows` (one Triton kernel on CUDA)."""
    if not w8a8:
        return x, None
    if x.is_cuda:
        from minisgl_core.layers.triton_e4m3 import quantize_rows_triton

        return quantize_rows_triton(x)
    return e4m3.quantize_rows(x)


def _dtype_runs_on(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the grouped GEMM converts ``dtype`` on ``device``: Triton has e4m3 from sm_89."""
    if dtype != torch.float8_e4m3fn or device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _describe(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} on {t.device}"


class Router(nn.Module):
    """The router's ``[experts, hidden]`` weight (checkpoint name ``mlp.gate.weight``), replicated."""

    def __init__(self, hidden: int, num_experts: int, *, dtype: torch.dtype | None, device: Any) -> None:
        super().__init__()
        self.weight = new_param((num_experts, hidden), dtype, device, load_full)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Experts(nn.Module):
    """Every expert's weights, this rank's share of their intermediate size (see the module).

    Quantized at load (:meth:`quantize`, ``--quantization`` with a method that quantizes experts):
    ``w13`` and ``w2`` hold values of a :data:`QUANTIZED_EXPERT_DTYPES` dtype and ``w13_scale``
    ``[experts, 2 * inter]`` / ``w2_scale`` ``[experts, hidden]`` (float32) one scale per expert
    and output row. int8 experts multiply the run-dtype activations (weight-only); e4m3 experts
    multiply each GEMM's input rounded to e4m3 a row at a time (:data:`W8A8_EXPERTS`)."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        num_experts: int,
        *,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
    ) -> None:
        super().__init__()
        self.parallel = parallel
        self.num_experts, self.full_inter = num_experts, inter
        self.inter = parallel.shard(inter, "moe_intermediate_size")
        # shard ids: (expert, 0) gate rows, (expert, 1) up rows; "gate_up" all experts at once
        self.w13 = new_param(
            (num_experts, 2 * self.inter, hidden), dtype, device, self._load_w13,
            shard_ids=tuple((e, j) for e in range(num_experts) for j in (0, 1)),
        )  # fmt: skip
        self.w2 = new_param(
            (num_experts, hidden, self.inter),
            dtype,
            device,
            self._load_w2,
            shard_ids=tuple(range(num_experts)),
        )
        self.w13_scale: torch.Tensor | None = None
        self.w2_scale: torch.Tensor | None = None

    @property
    def scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(w13_scale, w2_scale)`` when the weights are quantized, else None."""
        if self.w13_scale is None or self.w2_scale is None:
            return None
        return self.w13_scale, self.w2_scale

    def quantize(self, quantized: list[Any], source: str) -> None:
        """Replace ``w13`` and ``w2`` with ``quantized`` = ``[(values, scales)]`` for each, in that
        order (see the class); ValueError naming ``source`` (the method) when one does not fit."""
        for name, pair in zip(("w13", "w2"), quantized, strict=True):
            values, scales = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, None)
            weight = getattr(self, name)
            rows = tuple(weight.shape[:2])
            if (
                not isinstance(values, torch.Tensor)
                or not isinstance(scales, torch.Tensor)
                or values.dtype not in QUANTIZED_EXPERT_DTYPES
                or values.shape != weight.shape
                or values.device != weight.device
                or scales.dtype != torch.float32
                or tuple(scales.shape) != rows
                or scales.device != weight.device
                or not _dtype_runs_on(values.dtype, weight.device)
            ):
                raise ValueError(
                    f"{source} quantized the experts' {name} {tuple(weight.shape)} into "
                    f"{_describe(values)} with scales {_describe(scales)}: expected values of the "
                    f"same shape in one of {[str(d).removeprefix('torch.') for d in QUANTIZED_EXPERT_DTYPES]} "
                    f"and float32 scales {rows}, on {weight.device} (float8 needs a GPU of compute "
                    f"capability 8.9 or newer)"
                )
        for name, (values, scales) in zip(("w13", "w2"), quantized, strict=True):
            setattr(self, name, nn.Parameter(values.contiguous(), requires_grad=False))
            setattr(self, f"{name}_scale", scales.contiguous())

    def _rows(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of a full tensor's intermediate dimension ``dim``."""
        if loaded.shape[dim] != self.full_inter:
            raise ValueError(
                f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit: expected "
                f"{self.full_inter} (moe_intermediate_size) along dimension {dim}"
            )
        return loaded.narrow(dim, self.parallel.tp_rank * self.inter, self.inter)

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any) -> list[Any] | None:
        """Shard id ``(expert, 0)`` gate rows, ``(expert, 1)`` up rows; ``"fused"``: transformers 5's
        ``gate_up_proj`` ``[experts, 2 * inter, hidden]``, every expert's; ``("stacked", part)``: the
        gate (0) or up (1) rows of every expert, ``[experts, inter, hidden]`` (a GGUF file's
        ``ffn_gate_exps``). The last two return the shard ids they filled."""
        if isinstance(shard_id, tuple) and shard_id[0] == "stacked":
            part = shard_id[1]
            self._check_fused(loaded, ("gate_proj", "up_proj")[part], 1, self.full_inter)
            for expert in range(self.num_experts):
                self._load_w13(param, loaded[expert], (expert, part))
            return [(expert, part) for expert in range(self.num_experts)]
        if shard_id == "fused":
            self._check_fused(loaded, "gate_up_proj", 1, 2 * self.full_inter)
            for expert in range(self.num_experts):
                for part in (0, 1):
                    half = loaded[expert].narrow(0, part * self.full_inter, self.full_inter)
                    self._load_w13(param, half, (expert, part))
            return list(param.shard_ids)  # type: ignore[attr-defined]
        expert, part = shard_id
        self._check_expert(expert)
        dest = param.data[expert].narrow(0, part * self.inter, self.inter)
        copy_shard(dest, self._rows(loaded, 0))  # type: ignore[arg-type]
        return None

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Any) -> list[Any] | None:
        """Shard id ``expert``; ``"fused"``: transformers 5's ``down_proj`` ``[experts, hidden, inter]``."""
        if shard_id == "fused":
            self._check_fused(loaded, "down_proj", 2, self.full_inter)
            for expert in range(self.num_experts):
                self._load_w2(param, loaded[expert], expert)
            return list(param.shard_ids)  # type: ignore[attr-defined]
        self._check_expert(shard_id)
        copy_shard(param.data[shard_id], self._rows(loaded, 1))  # type: ignore[arg-type]
        return None

    def _check_expert(self, expert: int) -> None:
        # (an IndexError traceback from the copy: config.json counting fewer experts than the weights)
        if not 0 <= expert < self.num_experts:
            raise ValueError(
                f"the checkpoint holds expert {expert}; the model was built with {self.num_experts} experts"
            )

    def _check_fused(self, loaded: torch.Tensor, name: str, dim: int, size: int) -> None:
        if loaded.dim() != 3 or loaded.shape[0] != self.num_experts or loaded.shape[dim] != size:
            raise ValueError(
                f"checkpoint tensor experts.{name} of shape {tuple(loaded.shape)} does not fit: expected "
                f"{self.num_experts} experts along dimension 0 and {size} along dimension {dim}"
            )


class SparseMoE(nn.Module):
    """Router + experts (see the module): ``forward(x, reduce)`` as :class:`DecoderMLP`'s."""

    def __init__(
        self,
        hidden: int,
        inter: int,
        num_experts: int,
        top_k: int,
        *,
        renormalize: bool,
        parallel: ParallelContext,
        dtype: torch.dtype | None,
        device: Any,
        float32_weights: bool = False,
    ) -> None:
        super().__init__()
        self.float32_weights = float32_weights  # the router's weights not rounded (see route)
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be between 1 and num_experts {num_experts}")
        self.top_k, self.renormalize, self.parallel = top_k, renormalize, parallel
        self.gate = Router(hidden, num_experts, dtype=dtype, device=device)
        self.experts = Experts(hidden, inter, num_experts, parallel=parallel, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """``reduce=False``: this rank's partial sum, for the norm after the block to all-reduce (on
        one GPU, each token's expert rows, for that norm to add).

        Two fast paths where the experts run in Triton. ``moe_route``: the router's softmax,
        top-k, renormalization and rounding as one kernel (``_triton_moe.route``) rather than five
        torch kernels, on one H200 3.0-3.4 µs a layer against 15-25
        (``tools/device_moe.py --small-kernels``), the same ids and weights as :func:`route`.
        ``moe_sum_in_norm``: on one GPU, with ``reduce=False``, each token's ``top_k`` expert rows
        left to the norm after the block (``triton_ops.SplitKPartials``: ``RMSNorm`` adds them with
        the residual in one kernel) instead of summed by a kernel of their own, the same values up
        to the order of float32 additions. With the one-program schedule, Qwen3-30B-A3B
        ``--quantization fp8`` offline 8,618 tok/s against 7,808 with the three off (one H200, each
        a fresh machine's first run, BENCHMARKS.md); ``tests/test_moe.py`` checks both."""
        in_triton = moe_enabled(x)
        if in_triton and fast_paths.current().enabled("moe_route"):
            from minisgl_core.layers import _triton_moe

            router = _triton_moe.route
        else:
            router = route
        weights, ids = router(self.gate(x), self.top_k, self.renormalize, self.float32_weights)
        experts = self.experts
        if (
            not reduce
            and in_triton
            and fast_paths.current().enabled("moe_sum_in_norm")
            and self.parallel.tp_size == 1
            and triton_ops.split_k_norm_enabled(x.device)
        ):
            rows = experts_grouped(x, experts.w13, experts.w2, weights, ids, experts.scales, sum_rows=False)
            return triton_ops.SplitKPartials(rows.transpose(0, 1), x.dtype)  # type: ignore[return-value]
        run = experts_grouped if in_triton else experts_reference
        out = run(x, experts.w13, experts.w2, weights, ids, experts.scales)
        return self.parallel.all_reduce(out) if reduce else out

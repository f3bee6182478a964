"""Hand-written Triton kernels of the decoder layer (CUDA), where ``torch.compile``'s fall short.

**One kernel from the qkv projection to the KV pool.** After the qkv projection a decoder layer needs: optional per-head RMS norm on q and k (Qwen3),
rotary on q and k, and k and v written into the paged KV pool at the new tokens' slots. Through
``torch.compile`` that is two to four kernels, and its rotary kernel recomputes ``cos``/``sin``
for every element of every head (in an 8,192-token prefill step of Qwen3-0.6B on an H200 that
kernel took 125 µs per layer, busy with transcendentals). :func:`rope_store_kv` does all of it in
one kernel with three programs per token, for its q, k and v heads: the angles are computed once
per program, q goes to a fresh tensor, k and v straight to their pool slots. The decoder then
calls the backend's ``attend`` instead of ``forward`` (backends declaring ``"prestored_kv"``,
API 1.5). A first version with one program per (token, head) recomputed the angles per head and
was no faster than what it replaced (159 µs per layer on that prefill step).

The same arithmetic as :func:`minisgl_core.layers.fused.qkv_norm_rope` followed by
:meth:`~minisgl_core.api.KVCache.store`: norm in float32 rounded to the model dtype, times the
weight; angles ``position * inv_freq`` in float32, ``cos``/``sin`` rounded to the model dtype,
the rotation in float32 rounded once. ``MINISGL_FUSED_KV=0`` turns it off (ablation).

**SiLU·mul** (:func:`silu_and_mul`, ``MINISGL_TRITON_SILU=0`` turns it off): one program per
(token, 1024 columns).

Triton is imported on first use (the kernels live in ``_triton_kernels``); on the CPU, tests run
the kernels under ``TRITON_INTERPRET=1`` and compile them for sm_90 and sm_80.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from minisgl_core import environment, fast_paths

#: MINISGL_FUSED_KV -> "fused_kv", ...: callers name a switch by its environment variable
_SWITCH_OF_ENV_VAR = {var: name for name, var in fast_paths.ENV_VARS.items()}

if TYPE_CHECKING:
    from minisgl_core.api.attention import KVCache


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def fused_kv_enabled(device: torch.device) -> bool:
    """Whether the decoder should use :func:`rope_store_kv` on ``device``: on CUDA unless
    ``MINISGL_FUSED_KV=0`` or ``MINISGL_COMPILE=0``; elsewhere only under Triton's interpreter
    (``TRITON_INTERPRET=1``, which tests set to run the kernel on the CPU)."""
    return triton_enabled(device, "MINISGL_FUSED_KV")


def triton_enabled(device: torch.device, flag: str) -> bool:
    """A hand-written Triton kernel runs on ``device`` unless its fast-path switch (named by its
    environment variable ``flag``, see :mod:`minisgl_core.fast_paths`) or ``compile`` is off: on
    CUDA, elsewhere only under Triton's interpreter."""
    if not fast_paths.current().enabled(_SWITCH_OF_ENV_VAR[flag]):
        return False
    return triton_runs_on(device)


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton kernels can run on ``device``: CUDA, or any device under Triton's CPU
    interpreter (``TRITON_INTERPRET=1``, the tests); Triton installed."""
    if device.type != "cuda" and not environment.triton_interpreter():
        return False
    return triton_available()


#: whether the kernels launched now are captured into a graph that wants PDL (:func:`pdl_scope`)
_scoped_pdl: contextvars.ContextVar[bool] = contextvars.ContextVar("minisgl_scoped_pdl", default=False)


@contextlib.contextmanager
def pdl_scope(enabled: bool) -> Iterator[None]:
    """Within it, :func:`pdl_enabled` is ``enabled`` where ``MINISGL_PDL`` is unset: the CUDA
    graph runner captures its small decode graphs under ``pdl_scope(True)``."""
    token = _scoped_pdl.set(enabled)
    try:
        yield
    finally:
        _scoped_pdl.reset(token)


def pdl_enabled(device: torch.device) -> bool:
    """Whether the hand-written Triton kernels are launched with programmatic dependent launch:
    each starts launching while the kernel before it runs, waits for it in its first instruction
    (``gdc_wait``), then lets the kernel after it start launching (``gdc_launch_dependents``; without
    it a kernel's successor is launched only as its last blocks exit), which hides part of the gap
    between kernels in a CUDA graph. ``MINISGL_PDL=1`` everywhere, ``0`` nowhere; unset, inside
    :func:`pdl_scope` (the decode graphs of a few sequences, where it pays: BENCHMARKS.md). Only
    on CUDA devices of compute capability 9.0 or newer, with a Triton that has both instructions."""
    if device.type != "cuda":
        return False
    if not environment.switch("MINISGL_PDL", _scoped_pdl.get()):
        return False
    return _pdl_supported(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _pdl_supported(index: int) -> bool:
    if torch.cuda.get_device_capability(index) < (9, 0) or not triton_available():
        return False
    return _kernels().gdc_wait is not None


def float8_stores(device: torch.device) -> bool:
    """Whether :func:`rope_store_kv` writes a float8 e4m3 pool on ``device``: CUDA GPUs of compute
    capability 8.9 or newer (Triton has no e4m3 before: the kernel does not compile for sm_80). Not
    under Triton's CPU interpreter either, which rounds float32 to e4m3 wrongly (-31.2 to -16)."""
    if device.type != "cuda":
        return False
    return _float8_supported(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _float8_supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


def pdl_launch() -> dict:
    """The launch arguments of a kernel with a ``PDL`` parameter launched with programmatic
    dependent launch: its wait compiled in, and the launch attribute set."""
    return {"PDL": True, "launch_pdl": True}


def pdl_options(device: torch.device) -> dict:
    """:func:`pdl_launch` when :func:`pdl_enabled`, else none (the kernels' default: no wait, a
    plain launch)."""
    return pdl_launch() if pdl_enabled(device) else {}


def pdl_attention_enabled(device: torch.device) -> bool:
    """Whether the Triton backend's decode attention kernel is launched with programmatic
    dependent launch on its own (fast path ``pdl_attention``; ``MINISGL_PDL_ATTENTION=0`` turns it
    off), so its programs prefetch their first KV blocks into L2 while :func:`rope_store_kv`'s
    kernel, launched to release it early, still runs: on an H200 batch-1 decode of Qwen3-0.6B
    1.7-2.3% faster a token, offline throughput unchanged (BENCHMARKS.md). The devices of
    :func:`pdl_enabled` (compute capability 9.0+, a Triton with both instructions)."""
    if device.type != "cuda" or not fast_paths.current().enabled("pdl_attention"):
        return False
    return _pdl_supported(device.index if device.index is not None else torch.cuda.current_device())


def _release_options(device: torch.device) -> dict:
    """The launch of :func:`rope_store_kv`'s kernel under :func:`pdl_attention_enabled`: with PDL,
    so it lets the attention kernel after it start launching (its own wait, first thing, keeps it
    behind the GEMM before it as a plain launch does)."""
    return pdl_launch() if pdl_attention_enabled(device) else {}


def norm_enabled(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`rms_norm` serves this norm (``MINISGL_TRITON_NORM=0`` turns it off; the same
    device rules as :func:`fused_kv_enabled`): rows of at most :data:`_NORM_MAX` elements with unit
    last stride, a dense weight of the row's length in the activations' dtype (else the reference's
    result dtype differs)."""
    return (
        x.dim() >= 1
        and 0 < x.shape[-1] <= _NORM_MAX
        and x.stride(-1) == 1
        and weight.shape == x.shape[-1:]
        and weight.stride(0) == 1
        and weight.dtype == x.dtype
        and triton_enabled(x.device, "MINISGL_TRITON_NORM")
    )


#: the widest row :func:`rms_norm` takes in one program (wider rows go to the compiled kernel)
_NORM_MAX = 16384


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``weight * norm(x)`` over the last dimension, or with ``residual`` ``(weight * norm(x +
    residual), x + residual)``: one Triton kernel, one program per row, with
    :func:`minisgl_core.layers.fused.rms_norm`'s arithmetic.

    Why not the compiled kernel: outside CUDA graphs (prefill and mixed steps) a call through
    ``torch.compile`` cost about 170 µs of host time on the GPU machine (guards, the AOT wrapper,
    Inductor's launcher), 57 of them per Qwen3-0.6B forward: 10 of the 30 ms a 950-token prefill
    step spent on the host (``tools/device_prefill_host.py``, 2026-11-26)."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # a view where it can be (the row stride is passed)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = None
    if residual is not None:
        if residual.shape != x.shape:
            raise ValueError(f"rms_norm: residual of shape {tuple(residual.shape)} for x {tuple(x.shape)}")
        residual_rows = residual.reshape(-1, n)
        if residual_rows.stride(-1) != 1:
            residual_rows = residual_rows.contiguous()
        total = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = _pow2(n)
        _kernels().rms_norm_kernel[(rows.shape[0],)](
            rows,
            rows.stride(0),
            residual_rows if residual is not None else rows,
            residual_rows.stride(0) if residual is not None else 0,
            weight,
            float(eps),
            out,
            total if total is not None else out,
            n,
            BLOCK=block,
            ADD=residual is not None,
            num_warps=min(16, max(1, block // 256)),
            **pdl_options(x.device),
        )
    return out if total is None else (out, total)


def silu_mul_enabled(device: torch.device) -> bool:
    """Whether :func:`minisgl_core.layers.fused.silu_and_mul` runs :func:`silu_and_mul`
    (``MINISGL_TRITON_SILU=0`` turns it off; the same device rules as :func:`fused_kv_enabled`)."""
    return triton_enabled(device, "MINISGL_TRITON_SILU")


#: columns per program of the SiLU·mul kernel
_SILU_BLOCK = 1024


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up = [gate | up]`` (``[tokens, 2 * inter]``, last stride 1) as
    one Triton kernel over (token, 1024 columns) programs. Inductor's kernel for the same ran at
    1.6 TB/s on an 8,192-token Qwen3-0.6B prefill (95 µs per layer on an H200)."""
    tokens, width = gate_up.shape
    if width % 2 or gate_up.stride(1) != 1:
        raise ValueError(
            f"silu_and_mul: gate_up of shape {tuple(gate_up.shape)} and strides {gate_up.stride()}"
        )
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=gate_up.dtype, device=gate_up.device)
    if tokens:
        grid = (tokens, -(-inter // _SILU_BLOCK))
        _kernels().silu_mul_kernel[grid](
            gate_up,
            gate_up.stride(0),
            out,
            inter,
            BLOCK=_SILU_BLOCK,
            num_warps=4,
            **pdl_options(gate_up.device),
        )
    return out


#: the most rows :func:`small_gemm` serves (decode batches of up to 64 requests)
SMALL_GEMM_MAX_ROWS = 64
#: a weight at least this many rows long is vocabulary-sized (an lm_head)
_VOCAB_ROWS = 32768
#: a "narrow" weight (fewer rows than columns) of at most this many elements goes to
#: :func:`small_gemm` (the o_proj and down_proj of small models)
_NARROW_MAX_ELEMENTS = 16 * 2**20


def small_gemm_config(rows: int, n: int, k: int) -> tuple[int, int, int, int] | None:
    """``(BLOCK_M, BLOCK_N, BLOCK_K, SPLIT)`` of :func:`small_gemm` for ``[rows, k] @ [n, k].T``, or
    None where cuBLAS is as fast. From ``tools/device_gemm.py`` on an H200 (BENCHMARKS.md, "bf16
    GEMMs of a few rows"): cuBLAS runs Qwen3-0.6B's o_proj (1024 x 2048) at one row in 12.7 µs
    where 4-way split K over 32-column tiles takes 5.3; narrow weights of small models (N < K, up
    to 16 Mi elements) gain 2-58% up to 64 rows, vocabulary-sized ones 3-9% with 64-column tiles
    and no split; square and wide weights (qkv, gate_up) do not, and stay with cuBLAS."""
    if not 1 <= rows <= SMALL_GEMM_MAX_ROWS:
        return None
    block_m = max(16, _pow2(rows))
    if n >= _VOCAB_ROWS:
        return block_m, 64 if rows <= 32 else 128, 128, 1
    if n < k and n * k <= _NARROW_MAX_ELEMENTS:
        return block_m, 32, 128, max(1, min(4, k // 512))
    return None


def small_gemm_k_per_split(k: int, block_k: int, split: int) -> int:
    """The K each of ``split`` slices covers, a multiple of ``block_k`` (the kernel's constant
    ``K_PER_SPLIT``)."""
    per_split = -(-k // split)
    return -(-per_split // block_k) * block_k


def small_gemm_enabled(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`small_gemm` serves ``x @ weight.T`` (``MINISGL_TRITON_SMALL_GEMM=0`` turns it
    off; the same device rules as :func:`fused_kv_enabled`): two-dimensional ``x`` of half
    precision with unit last stride, a contiguous weight of its dtype, and a shape
    :func:`small_gemm_config` picks."""
    return (
        x.dim() == 2
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and x.shape[1] == weight.shape[1]
        and x.stride(1) == 1
        and weight.is_contiguous()
        and small_gemm_config(x.shape[0], weight.shape[0], weight.shape[1]) is not None
        and triton_enabled(x.device, "MINISGL_TRITON_SMALL_GEMM")
    )


#: elements per program of the split-K sum
_SPLIT_SUM_BLOCK = 1024


class SplitKPartials:
    """A split-K :func:`small_gemm`'s float32 partial sums ``[split, rows, n]``, not yet added: what
    ``RowParallelLinear(reduce=False, split_k=True)`` returns on one GPU, for the RMS norm after it to add
    (:func:`add_partials_rms_norm`), one kernel fewer than :func:`small_gemm`'s own sum. ``parts``
    may also be the transposed view of a contiguous ``[rows, split, n]`` in any float dtype (a
    mixture of experts' rows of each token's choices, ``SparseMoE``)."""

    __slots__ = ("parts", "dtype")

    def __init__(self, parts: torch.Tensor, dtype: torch.dtype) -> None:
        self.parts = parts
        #: the dtype :func:`small_gemm` would have returned (its input's)
        self.dtype = dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def total(self) -> torch.Tensor:
        """The sum as :func:`small_gemm` returns it: the slices added in order in float32, rounded once."""
        acc = self.parts[0].to(torch.float32, copy=True)
        for part in self.parts[1:]:
            acc += part
        return acc.to(self.dtype)


def _small_gemm_launch(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Runs :func:`small_gemm`'s GEMM kernel: ``(output, 1)``, or ``(float32 partials [split, rows,
    n], split)`` where its tile splits K."""
    rows, k = x.shape
    n = weight.shape[0]
    config = small_gemm_config(rows, n, k)
    if config is None:
        raise ValueError(f"small_gemm: no tile for {rows} rows of a {n} x {k} weight")
    block_m, block_n, block_k, split = config
    k_per_split = small_gemm_k_per_split(k, block_k, split)
    if split == 1:
        target = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    else:
        target = torch.empty((split, rows, n), dtype=torch.float32, device=x.device)
    grid = (-(-n // block_n), -(-rows // block_m), split)
    _kernels().small_gemm_kernel[grid](
        x, x.stride(0), weight, target, rows, n, k,
        K_PER_SPLIT=k_per_split, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split, num_warps=4, num_stages=4,
    )  # fmt: skip
    return target, split


def small_gemm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for a few rows (:func:`small_gemm_config`'s shapes): tiles of 16-64 rows,
    float32 accumulation rounded once; with split K the slices' float32 partial sums are added in
    order by a second kernel (deterministic, no atomics)."""
    target, split = _small_gemm_launch(x, weight)
    if split == 1:
        return target
    _, rows, n = target.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    size = rows * n
    _kernels().split_sum_kernel[(-(-size // _SPLIT_SUM_BLOCK),)](
        target, out, size, SPLIT=split, BLOCK=_SPLIT_SUM_BLOCK, num_warps=4
    )
    return out


def small_gemm_partials(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | SplitKPartials:
    """:func:`small_gemm` without its last kernel: the partial sums where its tile splits K (for
    :func:`add_partials_rms_norm`), else its output."""
    target, split = _small_gemm_launch(x, weight)
    return target if split == 1 else SplitKPartials(target, x.dtype)


def split_k_norm_enabled(device: torch.device) -> bool:
    """Whether a ``RowParallelLinear(reduce=False, split_k=True)`` on one GPU leaves a split-K :func:`small_gemm`'s
    partial sums to the RMS norm after it (``MINISGL_SPLIT_K_NORM=0`` turns it off; the same device
    rules as :func:`fused_kv_enabled`)."""
    return triton_enabled(device, "MINISGL_SPLIT_K_NORM")


def add_partials_rms_norm(
    partials: SplitKPartials, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * norm(total + residual), total + residual)`` with ``total =
    partials.total()``: the split-K sum, the residual add and the norm in one kernel (one program
    per row), bitwise :func:`small_gemm` followed by :func:`rms_norm` with the residual. The caller
    checks :func:`norm_enabled` for ``residual`` and that it has the partials' dtype and shape."""
    parts = partials.parts
    split, rows, n = parts.shape
    part_major = parts.is_contiguous()  # else [rows, split, n] seen transposed
    if (
        residual.shape != (rows, n)
        or residual.dtype != partials.dtype
        or not (part_major or parts.transpose(0, 1).is_contiguous())
    ):
        raise ValueError(
            f"add_partials_rms_norm: residual {tuple(residual.shape)} for partials {tuple(parts.shape)}"
        )
    if residual.stride(-1) != 1:
        residual = residual.contiguous()
    out = torch.empty((rows, n), dtype=residual.dtype, device=residual.device)
    total = torch.empty((rows, n), dtype=residual.dtype, device=residual.device)
    if rows:
        block = _pow2(n)
        _kernels().rms_norm_kernel[(rows,)](
            parts, n if part_major else split * n, residual, residual.stride(0), weight, float(eps), out, total, n,
            BLOCK=block, ADD=True, PARTS=split, PART_MAJOR=part_major, num_warps=min(16, max(1, block // 256)),
            **pdl_options(residual.device),
        )  # fmt: skip
    return out, total


@functools.cache
def _kernels():
    """The kernel module, imported once (it imports Triton)."""
    from minisgl_core.layers import _triton_kernels

    return _triton_kernels


def _pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (a Triton block size)."""
    return 1 << (n - 1).bit_length()


#: from this many tokens on :func:`rope_store_tiles` picks its second configuration (a second
#: compile of the kernel, which the model runner's warm-up does with a prefill of this length)
ROPE_STORE_WIDE_FROM = 512


def rope_store_tiles(tokens: int) -> tuple[int, int]:
    """(tokens a program, warps) of :func:`rope_store_kv`'s tiled kernel. On an H200 (forty-third
    session, ``tools/device_rope_store.py``) two tokens with 4 warps were fastest up to 256
    tokens (Qwen3-0.6B's heads at 256: 3.88 against 4.56 µs one token a program), four from
    1,024 on (8,192 tokens: 41.3 against 82.1 µs; Llama-3.1-8B's 62.1 against 84.1)."""
    return (2, 4) if tokens < ROPE_STORE_WIDE_FROM else (4, 4)


def rope_store_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    num_q_heads: int,
    num_kv_heads: int,
    eps: float,
    cache: KVCache,
    layer_id: int,
    loc: torch.Tensor,
    tiles: tuple[int, int] | bool = True,
) -> torch.Tensor:
    """Norm + rotary on the q and k heads of ``qkv`` (``[tokens, q_heads + 2 * kv_heads, head_dim]``),
    k and v written to ``cache`` layer ``layer_id`` at slots ``loc``; returns q ``[tokens, q_heads,
    head_dim]``. The first eight parameters are :func:`~minisgl_core.layers.fused.qkv_norm_rope`'s.
    ``tiles``: True picks :func:`rope_store_tiles` (tokens a program as one masked tile, warps),
    ``(tokens, warps)`` sets them, False is one token a program (the ``rope_store_tiles`` fast
    path off; ``tools/device_rope_store.py`` times them)."""
    tokens, heads, head_dim = qkv.shape
    if heads != num_q_heads + 2 * num_kv_heads or qkv.stride()[1:] != (head_dim, 1) or head_dim % 2:
        raise ValueError(f"rope_store_kv: qkv of shape {tuple(qkv.shape)} and strides {qkv.stride()}")
    if (cache.num_kv_heads, cache.head_dim) != (num_kv_heads, head_dim):
        raise ValueError("rope_store_kv: the KV pool's heads do not match qkv's")
    q = torch.empty((tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if tokens == 0:
        return q
    norm = q_weight is not None and k_weight is not None
    half = head_dim // 2
    if tiles is True:
        tiles = rope_store_tiles(tokens) if fast_paths.current().enabled("rope_store_tiles") else False
    per, warps = tiles or (1, 4)
    _kernels().rope_store_kernel[(-(-tokens // per), 3)](
        qkv, qkv.stride(0), positions, inv_freq, q_weight if norm else inv_freq,
        k_weight if norm else inv_freq, float(eps), q, cache.k_cache(layer_id), cache.v_cache(layer_id),
        loc, tokens, NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=half, BLOCK=_pow2(half),
        BLOCK_Q=_pow2(num_q_heads), BLOCK_KV=_pow2(num_kv_heads), NORM=norm, TOKENS=per, num_warps=warps,
        **(pdl_options(qkv.device) or _release_options(qkv.device)),
    )  # fmt: skip
    return q

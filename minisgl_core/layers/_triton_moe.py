"""The grouped GEMM of :mod:`minisgl_core.layers.moe` (imports Triton; imported on first use).

One program computes a ``block x BLOCK_N`` tile of the output for one block of (token, choice)
pairs that all chose the same expert (:func:`~minisgl_core.layers.moe.align_blocks` groups and
pads them): it gathers the block's input rows, multiplies them by that expert's weight matrix and
scatters the tile back to the pairs' rows. Blocks past the last expert's run and padding rows do
nothing, so the grid depends only on the number of pairs and a CUDA graph can capture it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minisgl_core import fast_paths


@triton.jit
def _dot(acc, a, b, IEEE: tl.constexpr, FP8_DOT: tl.constexpr):
    """``acc + a @ b``: e4m3 tiles (``FP8_DOT``) promoted to float32 once a tile (Hopper's
    accumulator alone keeps fewer bits); ``IEEE``: float32 tiles multiplied exactly."""
    if FP8_DOT:
        acc += tl.dot(a, b, max_num_imprecise_acc=a.shape[1])
    elif IEEE:
        acc += tl.dot(a, b, input_precision="ieee")
    else:
        acc += tl.dot(a, b)
    return acc


@triton.jit
def _tile_product(
    acc,
    x,
    w_ptrs,
    mask,
    CONVERT: tl.constexpr,
    IEEE: tl.constexpr,
    FP8_DOT: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """``acc + x @ w`` for the weight tile at ``w_ptrs`` (``CONVERT``: quantized values, each
    converted exactly to ``x``'s dtype first, unless ``FP8_DOT``: both e4m3, the FP8 tensor cores'
    product). ``SWAP_AB``: the tile is ``[columns, depth]`` and ``acc`` the transposed sum,
    ``acc + w @ x.T``: the weights' columns are the product's rows."""
    y = tl.load(w_ptrs, mask=mask, other=0.0)
    if CONVERT and not FP8_DOT:
        y = y.to(x.dtype)
    if SWAP_AB:
        acc = _dot(acc, y, tl.trans(x), IEEE, FP8_DOT)
    else:
        acc = _dot(acc, x, y, IEEE, FP8_DOT)
    return acc


@triton.jit
def grouped_gemm_kernel(
    a, a_stride, w, w_stride_e, w_stride_n, c, c_stride, sorted_pairs, block_expert, scale,
    w_scale, w_scale_stride, a_scale, pairs, n, k, num_experts,
    ROW_DIV: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_W_SCALE: tl.constexpr, IEEE: tl.constexpr,
    GATED: tl.constexpr, HAS_A_SCALE: tl.constexpr, FP8_DOT: tl.constexpr, SWAP_AB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """``c[p] = (a[p // ROW_DIV] @ w[e].T) * scale[p]`` for the pairs ``p`` of block
    ``program_id(1)``, whose expert is ``e``; columns ``program_id(0) * BLOCK_N`` on.

    ``GATED``: ``w[e]`` is ``[gate | up]`` (``2 * n`` rows) and ``c[p] = silu(g) * u`` with ``g``
    and ``u`` the products with the two halves, each first rounded to ``c``'s dtype (what
    ``silu_mul_kernel`` computes from the unfused GEMM's output): one program takes a column tile
    of both halves, so the ``[pairs, 2 * n]`` product is never written.

    ``HAS_W_SCALE``: ``w`` holds quantized values (float8 e4m3 or int8), each converted exactly to
    ``a``'s dtype before the product, and output column ``j`` of expert ``e`` is multiplied by
    ``w_scale[e, j]`` (float32) after the sum, before anything else.

    ``HAS_A_SCALE`` (e4m3 weights): ``a`` holds e4m3 rows too, row ``r`` standing for
    ``a[r] * a_scale[r]``, applied after ``w_scale``. ``FP8_DOT``: the e4m3 tiles multiplied as
    they are (the GPU's FP8 tensor cores); else both converted to float32 first (the interpreter):
    the same exact products either way. ``SWAP_AB``: the product taken transposed,
    ``w[e] @ a[rows].T``, then the sums transposed back: with e4m3 tiles a block of fewer than 64
    rows still reaches Hopper's e4m3 wgmma, whose ``M`` side (64 rows) is then the block's weight
    columns (:data:`SWAP_AB_BELOW`)."""
    pid_n = tl.program_id(0)  # a block's column tiles run side by side: its rows stay in L2
    pid_m = tl.program_id(1)
    expert = tl.load(block_expert + pid_m)
    if expert >= num_experts:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_pairs + offs_m)
    valid = pair < pairs
    row = pair // ROW_DIV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < n
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a + row[:, None].to(tl.int64) * a_stride + offs_k[None, :]
    w_ptrs = w + expert.to(tl.int64) * w_stride_e
    if SWAP_AB:  # [BLOCK_N, BLOCK_K] tiles, the sums transposed
        w_ptrs += offs_n[:, None].to(tl.int64) * w_stride_n + offs_k[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # GATED only
    else:  # [BLOCK_K, BLOCK_N] tiles
        w_ptrs += offs_n[None, :].to(tl.int64) * w_stride_n + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # GATED only
    up_ptrs = w_ptrs + n.to(tl.int64) * w_stride_n
    for k0 in range(0, k, BLOCK_K):
        k_ok = offs_k < k - k0
        x = tl.load(a_ptrs, mask=valid[:, None] & k_ok[None, :], other=0.0)
        if HAS_A_SCALE and not FP8_DOT:
            x = x.to(tl.float32)
        if SWAP_AB:
            w_ok = n_ok[:, None] & k_ok[None, :]
        else:
            w_ok = k_ok[:, None] & n_ok[None, :]
        acc = _tile_product(acc, x, w_ptrs, w_ok, HAS_W_SCALE, IEEE, FP8_DOT, SWAP_AB)
        if GATED:
            acc_up = _tile_product(acc_up, x, up_ptrs, w_ok, HAS_W_SCALE, IEEE, FP8_DOT, SWAP_AB)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SWAP_AB:
        acc = tl.trans(acc)
        if GATED:
            acc_up = tl.trans(acc_up)
    if HAS_W_SCALE:
        scale_row = w_scale + expert.to(tl.int64) * w_scale_stride
        acc = acc * tl.load(scale_row + offs_n, mask=n_ok, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(scale_row + n + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_A_SCALE:
        row_scale = tl.load(a_scale + row, mask=valid, other=0.0)[:, None]
        acc = acc * row_scale
        if GATED:
            acc_up = acc_up * row_scale
    if GATED:
        gate = acc.to(c.dtype.element_ty).to(tl.float32)
        acc = gate * tl.sigmoid(gate) * acc_up.to(c.dtype.element_ty).to(tl.float32)
    if HAS_SCALE:
        acc = acc * tl.load(scale + pair, mask=valid, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c + pair[:, None].to(tl.int64) * c_stride + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit
def route_kernel(
    logits, logits_stride, weights, ids, num_experts,
    TOP_K: tl.constexpr, K_POW2: tl.constexpr, EXPERTS: tl.constexpr, RENORMALIZE: tl.constexpr,
):  # fmt: skip
    """One token a program: :func:`~minisgl_core.layers.moe.route` in one kernel. The softmax over
    the experts in float32, then the ``TOP_K`` largest one at a time, largest first (the lowest
    expert index among equal values), divided by their sum when ``RENORMALIZE``; weights stored in
    ``weights``' dtype, expert ids as int64."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, EXPERTS)
    real = offs < num_experts
    scores = tl.load(logits + row * logits_stride + offs, mask=real, other=float("-inf")).to(tl.float32)
    e = tl.exp(scores - tl.max(scores, axis=0))
    probs = tl.where(real, e / tl.sum(e, axis=0), -1.0)  # past the last expert: never chosen
    slots = tl.arange(0, K_POW2)
    chosen_w = tl.zeros((K_POW2,), dtype=tl.float32)
    chosen_id = tl.zeros((K_POW2,), dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best, at = tl.max(probs, axis=0, return_indices=True, return_indices_tie_break_left=True)
        chosen_w = tl.where(slots == j, best, chosen_w)
        chosen_id = tl.where(slots == j, at.to(tl.int64), chosen_id)
        probs = tl.where(offs == at, -1.0, probs)
    if RENORMALIZE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=0)
    out = row * TOP_K + slots
    tl.store(weights + out, chosen_w.to(weights.dtype.element_ty), mask=slots < TOP_K)
    tl.store(ids + out, chosen_id, mask=slots < TOP_K)


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, float32_weights: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`minisgl_core.layers.moe.route` returns, from one kernel (five torch ops there)."""
    tokens, num_experts = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dtype = torch.float32 if float32_weights else logits.dtype
    weights = torch.empty(tokens, top_k, dtype=dtype, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        experts = max(16, triton.next_power_of_2(num_experts))
        route_kernel[(tokens,)](
            logits, logits.stride(0), weights, ids, num_experts,
            TOP_K=top_k, K_POW2=max(2, triton.next_power_of_2(top_k)), EXPERTS=experts,
            RENORMALIZE=renormalize, num_warps=1 if experts <= 256 else 4,
        )  # fmt: skip
    return weights, ids


@triton.jit
def count_pairs_kernel(ids, counts, slot, sorted_pairs, pairs, slots, BLOCK: tl.constexpr):
    """``slot[p]``: pair ``p``'s place in its expert's run (the expert's count before it, by an
    atomic add: the order inside a run is whichever the atomics took, which changes no output row);
    ``sorted_pairs`` filled with the no-pair index ``pairs``, which the scatter then overwrites."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < pairs
    expert = tl.load(ids + offs, mask=ok, other=0)
    tl.store(slot + offs, tl.atomic_add(counts + expert, 1, mask=ok, sem="relaxed"), mask=ok)
    tl.store(sorted_pairs + offs, pairs, mask=offs < slots)


@triton.jit
def _store_runs(
    counted, starts, block_expert, experts, real, blocks, ROWS: tl.constexpr, BLOCKS: tl.constexpr
):
    """From each expert's pair count: its run padded to a multiple of ``ROWS`` pairs, its first
    place (``starts``), and each block's expert (``num_experts`` past the last run)."""
    padded = (counted + ROWS - 1) // ROWS * ROWS
    ends = tl.cumsum(padded, axis=0)
    tl.store(starts + experts, ends - padded, mask=real)
    for b0 in range(0, blocks, BLOCKS):
        b = b0 + tl.arange(0, BLOCKS)
        done = (ends[None, :] <= (b * ROWS)[:, None]) & real[None, :]  # runs ending by the block's start
        tl.store(block_expert + b, tl.sum(done.to(tl.int32), axis=1), mask=b < blocks)


@triton.jit
def run_starts_kernel(
    counts, starts, block_expert, num_experts, blocks,
    ROWS: tl.constexpr, EXPERTS: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """One program: each expert's run padded to a multiple of ``ROWS`` pairs, its first place
    (``starts``), and each block's expert (``num_experts`` past the last run)."""
    experts = tl.arange(0, EXPERTS)
    real = experts < num_experts
    _store_runs(tl.load(counts + experts, mask=real, other=0), starts, block_expert, experts, real, blocks,
                ROWS, BLOCKS)  # fmt: skip


@triton.jit
def scatter_pairs_kernel(ids, starts, slot, sorted_pairs, pairs, BLOCK: tl.constexpr):
    """``sorted_pairs[starts[e] + slot[p]] = p`` for every pair ``p`` of expert ``e``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < pairs
    expert = tl.load(ids + offs, mask=ok, other=0)
    dest = tl.load(starts + expert, mask=ok, other=0) + tl.load(slot + offs, mask=ok, other=0)
    tl.store(sorted_pairs + dest, offs.to(tl.int64), mask=ok)


@triton.jit
def align_one_program_kernel(
    ids, counts, starts, sorted_pairs, block_expert, pairs, slots, num_experts, blocks,
    ROWS: tl.constexpr, EXPERTS: tl.constexpr, PAIRS: tl.constexpr, FILL: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """:func:`align`'s three kernels (and the zeroed count) as one program, for a step of at most
    ``PAIRS`` pairs: the counts zeroed, each pair's place in its expert's run taken by an atomic add,
    the runs' starts and each block's expert, then the pairs scattered. Barriers order the steps
    (one program: every step sees the one before); the counts and starts are read back past L1."""
    experts = tl.arange(0, EXPERTS)
    real = experts < num_experts
    tl.store(counts + experts, tl.zeros((EXPERTS,), dtype=tl.int32), mask=real)
    for f0 in range(0, slots, FILL):  # every slot "no pair" until the scatter
        fill = f0 + tl.arange(0, FILL)
        tl.store(sorted_pairs + fill, tl.full((FILL,), 0, tl.int64) + pairs, mask=fill < slots)
    tl.debug_barrier()
    offs = tl.arange(0, PAIRS)
    ok = offs < pairs
    expert = tl.load(ids + offs, mask=ok, other=0)
    slot = tl.atomic_add(counts + expert, 1, mask=ok, sem="relaxed")
    tl.debug_barrier()
    counted = tl.load(counts + experts, mask=real, other=0, cache_modifier=".cg")
    _store_runs(counted, starts, block_expert, experts, real, blocks, ROWS, BLOCKS)
    tl.debug_barrier()
    dest = tl.load(starts + expert, mask=ok, other=0, cache_modifier=".cg") + slot
    tl.store(sorted_pairs + dest, offs.to(tl.int64), mask=ok)


#: steps of at most this many (token, choice) pairs build their schedule with one program
#: (``align_one_program_kernel``) rather than three kernels and a zeroed count; at most 4,096
#: whatever it says (a program's registers). On one H200 (``tools/device_moe.py --small-kernels``,
#: top-8 of 128 experts) one program takes 3.3 / 7.1 / 11.0 / 17.3 µs at 8 / 512 / 2,048 / 4,096
#: pairs against the three kernels' 5.4 / 9.8 / 11.4 / 13.4. A user turns it off with
#: ``--disable-fast-path moe_one_program``
ONE_PROGRAM_PAIRS = 2048
#: warps of the schedule's one program: on one H200 (``tools/device_moe.py --small-kernels``, top-8
#: of 128 experts) 16 take 3.39 / 4.20 / 6.89 / 10.65 µs at 1 / 8 / 64 / 256 tokens against 4
#: warps' 3.43 / 4.44 / 7.40 / 11.87 (8 warps: 3.58 / 4.52 / 7.26 / 10.74)
ONE_PROGRAM_WARPS = 16


def align(ids: torch.Tensor, num_experts: int, block: int, blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~minisgl_core.layers.moe.align_blocks`'s schedule in three small kernels (and a
    zeroed count): the pairs counted, the runs' starts, the pairs scattered; or, for a step of at
    most :data:`ONE_PROGRAM_PAIRS` pairs, in one program (``align_one_program_kernel``)."""
    flat = ids.reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    pairs, slots, device = flat.numel(), blocks * block, ids.device
    one_program = pairs <= min(ONE_PROGRAM_PAIRS, 4096) and fast_paths.current().enabled("moe_one_program")
    counts = (torch.empty if one_program else torch.zeros)(num_experts, dtype=torch.int32, device=device)
    starts = torch.empty(num_experts, dtype=torch.int32, device=device)
    sorted_pairs = torch.empty(slots, dtype=torch.int64, device=device)
    block_expert = torch.empty(blocks, dtype=torch.int64, device=device)
    if one_program:  # (the kernel zeroes the counts)
        align_one_program_kernel[(1,)](
            flat, counts, starts, sorted_pairs, block_expert, pairs, slots, num_experts, blocks,
            ROWS=block, EXPERTS=max(16, triton.next_power_of_2(num_experts)),
            PAIRS=max(16, triton.next_power_of_2(pairs)), FILL=1024, BLOCKS=32, num_warps=ONE_PROGRAM_WARPS,
        )  # fmt: skip
        return sorted_pairs, block_expert
    slot = torch.empty(pairs, dtype=torch.int32, device=device)
    per_program = 1024
    count_pairs_kernel[(triton.cdiv(max(pairs, slots), per_program),)](
        flat, counts, slot, sorted_pairs, pairs, slots, BLOCK=per_program
    )
    run_starts_kernel[(1,)](
        counts, starts, block_expert, num_experts, blocks,
        ROWS=block, EXPERTS=max(16, triton.next_power_of_2(num_experts)), BLOCKS=32,
    )  # fmt: skip
    scatter_pairs_kernel[(triton.cdiv(pairs, per_program),)](
        flat, starts, slot, sorted_pairs, pairs, BLOCK=per_program
    )
    return sorted_pairs, block_expert


#: W8A8 blocks of fewer rows than this take their product transposed (the kernel's ``SWAP_AB``):
#: Hopper's e4m3 wgmma instead of ``mma.sync`` of tiles converted to float16. A layer's experts
#: 1.3-4.6% faster at 1 to 256 tokens on one H200 (the default launch's row of
#: ``tools/device_moe.py --experts fp8 --swap-below 0`` against ``64``; BENCHMARKS.md)
SWAP_AB_BELOW = 64


def launch_config(
    block: int, n: int, k: int, pairs: int = 1 << 30, gated: bool = False, w8a8: bool = False
) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) for blocks of ``block`` rows and an ``n x k``
    expert matrix (``gated``: ``n`` columns of each half), from a sweep on one H200 at
    Qwen3-30B-A3B's shape (``tools/device_moe.py``, BENCHMARKS.md): the fastest launch for each
    block size there, and for a step of at most 64 pairs (8 tokens of top-8) shallower tiles,
    which reach more experts at once. ``w8a8`` (e4m3 by e4m3): from 64-row blocks (the e4m3
    wgmma, prefill) 128-deep tiles and 8 warps, 28% faster than the bf16 launch at 8,192 tokens;
    at most 64 pairs (products transposed, :data:`SWAP_AB_BELOW`) 128 x 128 tiles and 8 warps,
    28% faster at 8 tokens; up to 32-row blocks (decode) 64-column tiles, which take the down GEMM
    at 256 tokens 58.1 µs against 60.2 at 128 columns (57.3 against 60.4 in an earlier call;
    ``tools/device_moe.py --experts fp8``, BENCHMARKS.md); otherwise as bf16."""
    if w8a8 and block >= 64:
        block_n, block_k, warps, stages = (128, 128, 8, 4) if block <= 64 else (64, 128, 8, 4)
    elif w8a8 and block <= 16 and pairs <= 64:
        block_n, block_k, warps, stages = 128, 128, 8, 4
    elif w8a8 and block <= 32:
        block_n, block_k, warps, stages = 64, 128, 4, 3
    elif block <= 16:
        block_n, block_k, warps, stages = (64, 64, 4, 4) if pairs <= 64 else (64, 128, 4, 3)
    elif block <= 32:
        block_n, block_k, warps, stages = 128, 128, 4, 3
    elif block <= 64:
        block_n, block_k, warps, stages = 128, 64, 4, 3
    else:
        block_n, block_k, warps, stages = 128, 64, 8, 3
    if gated and block_n > 64:  # two tiles of weights a stage: as many bytes as one unfused tile
        block_n //= 2
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    return block_n, block_k, warps, stages


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_pairs: torch.Tensor,
    block_expert: torch.Tensor,
    pairs: int,
    block: int,
    *,
    row_div: int,
    scale: torch.Tensor | None = None,
    gated: bool = False,
    w_scale: torch.Tensor | None = None,
    a_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """``[pairs, w.shape[1]]``: row ``p`` is ``a[p // row_div] @ w[e].T`` (times ``scale[p]``) for
    the expert ``e`` that pair ``p`` chose (see the module). ``gated``: ``[pairs, w.shape[1] // 2]``,
    SiLU(gate half) · up half (the kernel's ``GATED``). ``w_scale``: ``w`` is quantized (float8
    e4m3 or int8), ``w[e] * w_scale[e][:, None]`` the matrix it stands for (``HAS_W_SCALE``);
    with e4m3 weights ``a`` is e4m3 as well, ``a[r] * a_scale[r]`` the row it stands for (float32
    ``[rows]`` or ``[rows, 1]``, :func:`~minisgl_core.layers.triton_e4m3.quantize_rows_triton`'s), and
    the output in ``out_dtype``.
    ``config``: (BLOCK_N, BLOCK_K, warps, stages) instead of :func:`launch_config`'s
    (``tools/device_moe.py`` sweeps them). W8A8 blocks of fewer than :data:`SWAP_AB_BELOW` rows
    take their product transposed (the kernel's ``SWAP_AB``)."""
    if a.stride(-1) != 1:
        a = a.contiguous()
    num_experts, n, k = w.shape
    if a.shape[1] != k or w.stride(2) != 1 or (gated and n % 2):
        raise ValueError(f"grouped GEMM of {tuple(a.shape)} by experts {tuple(w.shape)}: sizes do not fit")
    w8a8 = w.dtype == torch.float8_e4m3fn
    if (
        (w_scale is None) == (w.dtype != a.dtype or w8a8)
        or (w_scale is not None and (w_scale.shape != w.shape[:2] or w_scale.stride(1) != 1))
        or (a_scale is not None) != (w8a8 and a.dtype == w.dtype)
        or (a_scale is not None and (a_scale.numel() != a.shape[0] or not a_scale.is_contiguous()))
    ):
        raise ValueError(f"grouped GEMM of {a.dtype} rows by {w.dtype} experts: scales missing or misshapen")
    if gated:
        n //= 2
    fp8_dot = a_scale is not None and a.is_cuda
    swap_ab = a_scale is not None and block < SWAP_AB_BELOW
    out = torch.empty(pairs, n, dtype=out_dtype or a.dtype, device=a.device)
    block_n, block_k, warps, stages = config or launch_config(block, n, k, pairs, gated, a_scale is not None)
    grid = (triton.cdiv(n, block_n), block_expert.numel())
    grouped_gemm_kernel[grid](
        a, a.stride(0), w, w.stride(0), w.stride(1), out, out.stride(0), sorted_pairs, block_expert,
        scale if scale is not None else out, w_scale if w_scale is not None else out,
        w_scale.stride(0) if w_scale is not None else 0, a_scale if a_scale is not None else out, pairs, n, k,
        num_experts,
        ROW_DIV=row_div, HAS_SCALE=scale is not None, HAS_W_SCALE=w_scale is not None,
        IEEE=a.dtype == torch.float32 or (a_scale is not None and not fp8_dot), GATED=gated, HAS_A_SCALE=a_scale is not None,
        FP8_DOT=fp8_dot, SWAP_AB=swap_ab,
        BLOCK_M=block, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out

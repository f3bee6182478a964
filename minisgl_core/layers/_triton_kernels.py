"""The hand-written Triton kernels of the decoder layer, wrapped in
:mod:`minisgl_core.layers.triton_ops` (imported on first use: this module imports Triton,
which CPU installs may lack)."""

import triton
import triton.language as tl

try:  # programmatic dependent launch (Hopper on): the kernels wait for the kernel before them
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # an older Triton: PDL stays off (minisgl_core.layers.triton_ops.pdl_enabled)
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _norm_rope(x1, x2, weight, cos, sin, eps, d, mask, HALF: tl.constexpr, NORM: tl.constexpr):
    """``[tokens, heads, half]`` halves of the heads: RMS norm over each head (times ``weight``),
    then rotary with ``cos``, ``sin`` (``[tokens, 1, half]``)."""
    dtype = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    if NORM:
        w1 = tl.load(weight + d, mask=mask).to(tl.float32)
        w2 = tl.load(weight + HALF + d, mask=mask).to(tl.float32)
        r = tl.rsqrt((tl.sum(x1 * x1, 2) + tl.sum(x2 * x2, 2)) / (2 * HALF) + eps)[:, :, None]
        x1 = ((x1 * r).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
        x2 = ((x2 * r).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _pool_value(x, pool, dtype):
    """``x`` as the KV pool ``pool`` stores it: rounded to the model's ``dtype`` first (what the
    unfused path stores), then, for a float8 e4m3 pool, saturated at ±448 and rounded again
    (``KVCache.store``'s cast: scale 1, no NaN)."""
    x = x.to(dtype)
    if pool.dtype.element_ty == tl.float8e4nv:
        x = tl.clamp(x.to(tl.float32), -448.0, 448.0)
    return x.to(pool.dtype.element_ty)


@triton.jit(do_not_specialize=["n_tokens"])  # one compile for every token count, not three
def rope_store_kernel(
    qkv,  # [tokens, q_heads + 2 * kv_heads, 2 * HALF], the heads dense, any token stride
    qkv_token_stride,
    positions,  # [tokens] int
    inv_freq,  # [HALF] float32
    q_weight,  # [2 * HALF] q-norm weight (any tensor when not NORM)
    k_weight,
    eps,
    q_out,  # [tokens, q_heads, 2 * HALF] contiguous
    k_pool,  # [slots, kv_heads, 2 * HALF] this layer's K (the model's dtype or float8 e4m3)
    v_pool,
    loc,  # [tokens] int: slot of each token
    n_tokens,
    NUM_Q: tl.constexpr,
    NUM_KV: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    NORM: tl.constexpr,
    TOKENS: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch: wait for the GEMM first
):
    """Per-head RMS norm (``NORM``) and rotary on q and k, q to ``q_out``, k and v to their slots.
    Program ``(block, part)``: ``TOKENS`` tokens as one masked ``[tokens, heads, half]`` tile (no
    loop: every load of the block in flight at once); part 0 the q heads, 1 the k heads, 2 the v
    heads (copied as they are)."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    part = tl.program_id(1)
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)[:, None, None]
    d = tl.arange(0, BLOCK)[None, None, :]
    mask = d < HALF
    live = t < n_tokens
    row = qkv + t * qkv_token_stride
    dtype = qkv.dtype.element_ty
    if part == 2:
        hv = tl.arange(0, BLOCK_KV)[None, :, None]
        mv = live & (hv < NUM_KV) & mask
        v_src = row + (NUM_Q + NUM_KV + hv) * (2 * HALF) + d
        slot = tl.load(loc + t, mask=live, other=0).to(tl.int64)
        v_dst = v_pool + slot * (NUM_KV * 2 * HALF) + hv * (2 * HALF) + d
        tl.store(v_dst, _pool_value(tl.load(v_src, mask=mv), v_pool, dtype), mask=mv)
        tl.store(v_dst + HALF, _pool_value(tl.load(v_src + HALF, mask=mv), v_pool, dtype), mask=mv)
    else:
        position = tl.load(positions + t, mask=live, other=0).to(tl.float32)
        angle = position * tl.load(inv_freq + d, mask=mask, other=0.0)
        cos = tl.cos(angle).to(dtype).to(tl.float32)
        sin = tl.sin(angle).to(dtype).to(tl.float32)
        if part == 0:
            hq = tl.arange(0, BLOCK_Q)[None, :, None]
            mq = live & (hq < NUM_Q) & mask
            q_src = row + hq * (2 * HALF) + d
            q1, q2 = _norm_rope(tl.load(q_src, mask=mq, other=0.0), tl.load(q_src + HALF, mask=mq, other=0.0),
                                q_weight, cos, sin, eps, d, mask, HALF, NORM)  # fmt: skip
            q_dst = q_out + (t * NUM_Q + hq) * (2 * HALF) + d
            tl.store(q_dst, q1.to(q_dst.dtype.element_ty), mask=mq)
            tl.store(q_dst + HALF, q2.to(q_dst.dtype.element_ty), mask=mq)
        else:
            hk = tl.arange(0, BLOCK_KV)[None, :, None]
            mk = live & (hk < NUM_KV) & mask
            k_src = row + (NUM_Q + hk) * (2 * HALF) + d
            k1, k2 = _norm_rope(tl.load(k_src, mask=mk, other=0.0), tl.load(k_src + HALF, mask=mk, other=0.0),
                                k_weight, cos, sin, eps, d, mask, HALF, NORM)  # fmt: skip
            slot = tl.load(loc + t, mask=live, other=0).to(tl.int64)
            k_dst = k_pool + slot * (NUM_KV * 2 * HALF) + hk * (2 * HALF) + d
            tl.store(k_dst, _pool_value(k1, k_pool, dtype), mask=mk)
            tl.store(k_dst + HALF, _pool_value(k2, k_pool, dtype), mask=mk)


@triton.jit
def silu_mul_kernel(gate_up, row_stride, out, inter, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """``out[row] = silu(gate) * up`` with ``gate_up[row] = [gate | up]``; in float32, rounded once.
    (``PDL``: launched with programmatic dependent launch, it first waits for the kernel before it.)"""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    src = gate_up + row * row_stride + cols
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + inter, mask=mask, other=0.0).to(tl.float32)
    dst = out + row * inter + cols
    tl.store(dst, (gate * tl.sigmoid(gate) * up).to(dst.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_kernel(
    x,  # [rows, n], last stride 1
    x_stride,
    residual,  # [rows, n] or a dummy when not ADD
    residual_stride,
    weight,  # [n]
    eps,
    out,  # [rows, n] contiguous: weight * norm(x [+ residual])
    total,  # [rows, n] contiguous: x + residual (when ADD)
    n,
    BLOCK: tl.constexpr,
    ADD: tl.constexpr,
    PDL: tl.constexpr = False,
    PARTS: tl.constexpr = 0,
    PART_MAJOR: tl.constexpr = True,
):
    """One row per program, Hugging Face's arithmetic: the residual sum rounded to the model dtype,
    the mean of squares and ``rsqrt`` in float32, the normalized row rounded, then times the weight
    and rounded again. (``PDL``: launched with programmatic dependent launch, it first waits for
    the kernel before it.) ``PARTS`` > 0 (with ``ADD``): ``x`` is a split-K GEMM's float32 partial
    sums ``[PARTS, rows, n]``, added here in slice order and rounded once to the residual's dtype,
    as ``split_sum_kernel`` would have (one kernel fewer); not ``PART_MAJOR``: ``x`` is ``[rows,
    PARTS, n]`` (``x_stride`` its row stride; a mixture of experts' rows of each token's choices,
    in any float dtype), added the same way."""
    if PDL:  # wait for the kernel before, then let the one after start launching
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    if PARTS:  # (None where a compile test leaves it unset)
        if PART_MAJOR:
            part_stride = tl.num_programs(0).to(tl.int64) * x_stride  # one program per row
        else:
            part_stride = n  # the parts of a row side by side
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(PARTS):
            acc += tl.load(x + s * part_stride + row * x_stride + cols, mask=mask, other=0.0)
        v = acc.to(residual.dtype.element_ty)
    else:
        v = tl.load(x + row * x_stride + cols, mask=mask, other=0.0)
    dtype = v.dtype
    if ADD:
        r = tl.load(residual + row * residual_stride + cols, mask=mask, other=0.0)
        v = (v.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(total + row * n + cols, v, mask=mask)
    v32 = v.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(v32 * v32, 0) / n + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    y = (v32 * inv_rms).to(dtype).to(tl.float32) * w
    tl.store(out + row * n + cols, y.to(out.dtype.element_ty), mask=mask)


# ``m`` and ``size`` follow the batch: unspecialized, so the variants compiled while the decode
# graphs are captured (1-64 rows) serve every row count an eager step brings (a prefill step's
# lm_head rows), with no compile inside a run
@triton.jit(do_not_specialize=["m"])
def small_gemm_kernel(
    x,  # [m, k], last stride 1
    x_stride,
    w,  # [n, k] contiguous
    out,  # [m, n] contiguous in x's dtype, or float32 partial sums [SPLIT, m, n]
    m,
    n,
    k,
    K_PER_SPLIT: tl.constexpr,  # a multiple of BLOCK_K; a constant because Triton's interpreter
    # on the GPU machine (3.6.0, as here) failed on a runtime ``range`` bound, a one-element array
    # where it wants a scalar; it follows the weight's K, so no more variants compile
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """``out = x @ w.T`` for a few rows: program (j, i, s) computes the ``[BLOCK_M, BLOCK_N]`` tile
    (i, j) over the s-th of ``SPLIT`` slices of K in float32; one slice is rounded to x's dtype and
    stored, several go to float32 partial sums that :func:`split_sum_kernel` adds in slice order."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        rk = k_start + k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            x + rm[:, None].to(tl.int64) * x_stride + rk[None, :],
            mask=(rm[:, None] < m) & (rk[None, :] < k),
            other=0.0,
        )
        b = tl.load(
            w + rn[None, :].to(tl.int64) * k + rk[:, None],
            mask=(rn[None, :] < n) & (rk[:, None] < k),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    dst = out + pid_k.to(tl.int64) * m * n + rm[:, None] * n + rn[None, :]
    tl.store(dst, acc.to(dst.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["size"])
def split_sum_kernel(partials, out, size, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """``out = partials.sum(0)`` over ``[SPLIT, size]`` float32, in slice order, rounded once."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(partials + s * size + offs, mask=offs < size, other=0.0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=offs < size)

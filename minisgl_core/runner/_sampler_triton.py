"""Triton kernel of the sampler's Gumbel-max draw (imported on first use: this module imports
Triton, which CPU installs may lack). See :func:`minisgl_core.runner.sampler.gumbel_argmax_chunked`."""

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit
def _quarter_max(logits_row, start, i, u, vocab, scale, noise_scale, FAST_LOG: tl.constexpr):
    """Max and first index of ``logits * scale + noise_scale * gumbel(u)`` over ids ``start + i``."""
    cols = start + i
    mask = cols < vocab
    x = tl.load(logits_row + cols, mask=mask, other=0.0).to(tl.float32)
    # e = -log(u) ~ Exp(1), then g = -log(e). Near u = 1, e is tiny and decides the largest noises,
    # and the hardware log2 (absolute error ~2^-22) would be off by its whole size there: for
    # v = 1 - u < 2^-10 a series (-log(1 - v) = v + v^2/2 + v^3/3, the next term below 2^-40 of
    # it), above that the hardware log (relative error then below 2^-11). The outer log only
    # needs relative accuracy.
    v = 1.0 - u
    near_one = v + v * v * (0.5 + v * (1.0 / 3.0))
    if FAST_LOG:
        e = tl.where(v < 1.0 / 1024, near_one, -libdevice.fast_logf(u))
        g = -libdevice.fast_logf(e)
    else:  # Triton's interpreter (CPU tests) has no libdevice
        e = tl.where(v < 1.0 / 1024, near_one, -tl.log(u))
        g = -tl.log(e)
    y = tl.where(mask, x * scale + noise_scale * g, float("-inf"))
    value, index = tl.max(y, 0, return_indices=True, return_indices_tie_break_left=True)
    return value, start + index


# Triton compiles one variant per specialisation of its int arguments (== 1, divisible by 16).
# The seed changes every call, so specialising on it meant a fresh compile (~0.6 s, on the host,
# stalling the run) the first time a seed came up divisible by 16: in the offline benchmark that was
# the 26th sampling step, inside the timed run, in every process.
@triton.jit(do_not_specialize=["seed"])
def gumbel_chunk_max_kernel(
    logits,  # [rows, vocab], last stride 1
    row_stride,
    scale,  # [rows] float32
    noise_scale,  # [rows] float32
    seed,
    vocab,
    best_value,  # [rows, chunks] float32
    best_index,  # [rows, chunks] int64
    chunks,
    TINY: tl.constexpr,
    CHUNK: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    # program (row, chunk): max and first argmax of logits * scale + noise_scale * gumbel there.
    # One Philox call gives four uniforms, one for each quarter of the chunk.
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    QUARTER: tl.constexpr = CHUNK // 4
    i = tl.arange(0, QUARTER)
    u0, u1, u2, u3 = tl.rand4x(seed, (row * chunks + chunk) * QUARTER + i)
    s = tl.load(scale + row)
    ns = tl.load(noise_scale + row)
    logits_row = logits + row * row_stride
    base = chunk * CHUNK
    v0, i0 = _quarter_max(logits_row, base, i, tl.maximum(u0, TINY), vocab, s, ns, FAST_LOG)
    v1, i1 = _quarter_max(logits_row, base + QUARTER, i, tl.maximum(u1, TINY), vocab, s, ns, FAST_LOG)
    v2, i2 = _quarter_max(logits_row, base + 2 * QUARTER, i, tl.maximum(u2, TINY), vocab, s, ns, FAST_LOG)
    v3, i3 = _quarter_max(logits_row, base + 3 * QUARTER, i, tl.maximum(u3, TINY), vocab, s, ns, FAST_LOG)
    # the first quarter holding the maximum wins a tie, as torch's argmax would pick
    best, at = v0, i0
    better = v1 > best
    best, at = tl.where(better, v1, best), tl.where(better, i1, at)
    better = v2 > best
    best, at = tl.where(better, v2, best), tl.where(better, i2, at)
    better = v3 > best
    best, at = tl.where(better, v3, best), tl.where(better, i3, at)
    tl.store(best_value + row * chunks + chunk, best)
    tl.store(best_index + row * chunks + chunk, at.to(tl.int64))


@triton.jit
def _quarter_keys(logits_row, cols, u, vocab, scale, noise_scale, FAST_LOG: tl.constexpr):
    """``logits * scale + noise_scale * gumbel(u)`` at ids ``cols`` (-inf past the vocabulary);
    the noise as :func:`_quarter_max` makes it."""
    mask = cols < vocab
    x = tl.load(logits_row + cols, mask=mask, other=0.0).to(tl.float32)
    v = 1.0 - u
    near_one = v + v * v * (0.5 + v * (1.0 / 3.0))
    if FAST_LOG:
        e = tl.where(v < 1.0 / 1024, near_one, -libdevice.fast_logf(u))
        g = -libdevice.fast_logf(e)
    else:
        e = tl.where(v < 1.0 / 1024, near_one, -tl.log(u))
        g = -tl.log(e)
    return tl.where(mask, x * scale + noise_scale * g, float("-inf"))


@triton.jit(do_not_specialize=["seed"])
def gumbel_span_max_kernel(
    logits,  # [rows, vocab], last stride 1
    row_stride,
    scale,  # [rows] float32
    noise_scale,  # [rows] float32
    seed,
    vocab,
    best_value,  # [rows, spans] float32
    best_index,  # [rows, spans] int64
    chunks,
    spans,
    TINY: tl.constexpr,
    CHUNK: tl.constexpr,
    SPAN: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    # program (row, span): SPAN consecutive chunks of gumbel_chunk_max_kernel, each with the same
    # noise (Philox counters) as there, kept as a running maximum per lane (ids visited in
    # increasing order, so a strict > keeps each lane's first); one reduction at the end, the
    # lowest id among the lanes holding the maximum.
    row = tl.program_id(0).to(tl.int64)
    span = tl.program_id(1)
    QUARTER: tl.constexpr = CHUNK // 4
    i = tl.arange(0, QUARTER)
    s = tl.load(scale + row)
    ns = tl.load(noise_scale + row)
    logits_row = logits + row * row_stride
    best = tl.full([QUARTER], float("-inf"), tl.float32)
    at = tl.zeros([QUARTER], tl.int32)
    for k in tl.static_range(SPAN):
        chunk = span * SPAN + k
        u0, u1, u2, u3 = tl.rand4x(seed, (row * chunks + chunk) * QUARTER + i)
        base = chunk * CHUNK + i
        y = _quarter_keys(logits_row, base, tl.maximum(u0, TINY), vocab, s, ns, FAST_LOG)
        better = y > best
        best, at = tl.where(better, y, best), tl.where(better, base, at)
        y = _quarter_keys(logits_row, base + QUARTER, tl.maximum(u1, TINY), vocab, s, ns, FAST_LOG)
        better = y > best
        best, at = tl.where(better, y, best), tl.where(better, base + QUARTER, at)
        y = _quarter_keys(logits_row, base + 2 * QUARTER, tl.maximum(u2, TINY), vocab, s, ns, FAST_LOG)
        better = y > best
        best, at = tl.where(better, y, best), tl.where(better, base + 2 * QUARTER, at)
        y = _quarter_keys(logits_row, base + 3 * QUARTER, tl.maximum(u3, TINY), vocab, s, ns, FAST_LOG)
        better = y > best
        best, at = tl.where(better, y, best), tl.where(better, base + 3 * QUARTER, at)
    top = tl.max(best, 0)
    first = tl.min(tl.where(best == top, at, 2147483647), 0)
    tl.store(best_value + row * spans + span, top)
    tl.store(best_index + row * spans + span, first.to(tl.int64))

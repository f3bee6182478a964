"""Triton kernel of the sampler's Gumbel-max draw (imported on first use: this module imports
Triton, which CPU installs may lack). See :func:`minisgl_core.runner.sampler.gumbel_argmax_chunked`."""

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice


@triton.jit
def _quarter_keys(logits_row, cols, u, vocab, scale, noise_scale, FAST_LOG: tl.constexpr):
    """``logits * scale + noise_scale * gumbel(u)`` at ids ``cols`` (-inf past the vocabulary)."""
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
    return tl.where(mask, x * scale + noise_scale * g, float("-inf"))


@triton.jit
def _running_max(best, at, logits_row, cols, u, vocab, scale, noise_scale, TINY: tl.constexpr,
                 FAST_LOG: tl.constexpr):  # fmt: skip
    """Each lane's running (maximum, its first id) after the keys at ``cols``."""
    y = _quarter_keys(logits_row, cols, tl.maximum(u, TINY), vocab, scale, noise_scale, FAST_LOG)
    better = y > best
    return tl.where(better, y, best), tl.where(better, cols, at)


# Triton compiles one variant per specialisation of its int arguments (== 1, divisible by 16).
# The seed changes every call, so specialising on it meant a fresh compile (~0.6 s, on the host,
# stalling the run) the first time a seed came up divisible by 16: in the offline benchmark that was
# the 26th sampling step, inside the timed run, in every process.
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
    # program (row, span): SPAN consecutive chunks of CHUNK ids. One Philox call gives four
    # uniforms, one for each quarter of a chunk (the counter: row, chunk, lane), so the noise of
    # an id does not depend on SPAN. Each lane keeps a running maximum (its ids come in increasing
    # order, so a strict > keeps its first); one reduction at the end: the lowest id among the
    # lanes holding the maximum, as torch's argmax picks.
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
        cols = chunk * CHUNK + i
        best, at = _running_max(best, at, logits_row, cols, u0, vocab, s, ns, TINY, FAST_LOG)
        best, at = _running_max(best, at, logits_row, cols + QUARTER, u1, vocab, s, ns, TINY, FAST_LOG)
        best, at = _running_max(best, at, logits_row, cols + 2 * QUARTER, u2, vocab, s, ns, TINY, FAST_LOG)
        best, at = _running_max(best, at, logits_row, cols + 3 * QUARTER, u3, vocab, s, ns, TINY, FAST_LOG)
    top = tl.max(best, 0)
    first = tl.min(tl.where(best == top, at, 2147483647), 0)
    tl.store(best_value + row * spans + span, top)
    tl.store(best_index + row * spans + span, first.to(tl.int64))

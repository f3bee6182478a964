"""Triton kernels of the sampler's Gumbel-max draw (imported on first use: this module imports
Triton, which CPU installs may lack). See :func:`minisgl_core.runner.sampler.gumbel_max_chunked`.

The draw is taken in two levels. Gumbel-max over the whole vocabulary, ``argmax(y + g)`` with
``y = logits * scale`` and one Gumbel noise per id, picks id ``i`` with probability
``exp(y_i) / Z``; so does picking a chunk ``c`` of ids with probability ``Z_c / Z`` (a Gumbel-max
over the chunks' ``log Z_c``, one noise per chunk) and then an id of that chunk with probability
``exp(y_i) / Z_c`` (a Gumbel-max over the chunk alone). :func:`chunk_stats_kernel` reads every
logit once for ``log Z_c`` (one exponential an id, no noise); :func:`chunk_race_kernel` draws the
noise only for the chunks and for the one chunk each row picks. The winning chunk's key is
distributed as the largest key of the one-level race (``Gumbel(log Z)``), so a rank's value
still competes with the other ranks' in :meth:`~minisgl_core.runner.sampler.Sampler.sample_sharded`.
With ``noise_scale`` 0 (greedy) both levels are plain maxima: the first id holding the row's
maximum, as torch's argmax.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _gumbel(u, FAST_LOG: tl.constexpr):
    """``-log(-log(u))`` for uniforms ``u`` in [TINY, 1)."""
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
    return g


@triton.jit
def chunk_stats_kernel(
    logits,  # [rows, vocab], last stride 1
    row_stride,
    scale,  # [rows] float32
    chunk_max,  # [rows, chunks] float32: the largest y of each chunk
    chunk_sum,  # [rows, chunks] float32: sum(exp(y - that maximum)), 0 where it is -inf
    vocab,
    chunks,
    CHUNK: tl.constexpr,
    SPAN: tl.constexpr,
):
    # program (row, span): SPAN consecutive chunks of CHUNK ids, each summarised on its own (so
    # the result does not depend on SPAN)
    row = tl.program_id(0).to(tl.int64)
    span = tl.program_id(1)
    s = tl.load(scale + row)
    i = tl.arange(0, CHUNK)
    logits_row = logits + row * row_stride
    for k in tl.static_range(SPAN):
        chunk = span * SPAN + k
        cols = chunk * CHUNK + i
        y = tl.load(logits_row + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32) * s
        top = tl.max(y, 0)
        total = tl.sum(tl.exp2((y - tl.where(top == float("-inf"), 0.0, top)) * _LOG2E), 0)
        tl.store(chunk_max + row * chunks + chunk, top, mask=chunk < chunks)
        tl.store(chunk_sum + row * chunks + chunk, total, mask=chunk < chunks)


@triton.jit
def _running_max(best, at, logits_row, cols, u, vocab, scale, noise_scale, FAST_LOG: tl.constexpr):
    """Each lane's running (largest key, its first id) after the keys at ``cols``."""
    mask = cols < vocab
    y = tl.load(logits_row + cols, mask=mask, other=0.0).to(tl.float32) * scale
    key = tl.where(mask, y + noise_scale * _gumbel(u, FAST_LOG), float("-inf"))
    better = key > best
    return tl.where(better, key, best), tl.where(better, cols, at)


# Triton compiles one variant per specialisation of its int arguments (== 1, divisible by 16).
# The seed changes every call, so specialising on it meant a fresh compile (~0.6 s, on the host,
# stalling the run) the first time a seed came up divisible by 16: in the offline benchmark that was
# the 26th sampling step, inside the timed run, in every process.
@triton.jit(do_not_specialize=["seed"])
def chunk_race_kernel(
    logits,  # [rows, vocab], last stride 1
    row_stride,
    scale,  # [rows] float32
    noise_scale,  # [rows] float32: 1 to draw, 0 for the argmax
    seed,
    vocab,
    chunk_max,  # [rows, chunks] float32, from chunk_stats_kernel
    chunk_sum,  # [rows, chunks] float32, from chunk_stats_kernel
    chunks,
    best_value,  # [rows] float32: the winning key
    best_index,  # [rows] int64: its id
    TINY: tl.constexpr,
    CHUNK: tl.constexpr,
    CHUNKS_P2: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    # program row. Philox noise, keyed by seed: a chunk's from the counter (row * chunks + chunk,
    # 0, 1, 0); an id's from (((row * chunks + chunk) * CHUNK / 4 + lane, 0, 0, 0), four uniforms
    # each, one per quarter of the chunk. Disjoint counters: independent noises.
    row = tl.program_id(0).to(tl.int64)
    s = tl.load(scale + row)
    ns = tl.load(noise_scale + row)
    c = tl.arange(0, CHUNKS_P2)
    has = c < chunks
    top = tl.load(chunk_max + row * chunks + c, mask=has, other=float("-inf"))
    total = tl.load(chunk_sum + row * chunks + c, mask=has, other=1.0)
    counter = (row * chunks + c).to(tl.uint32)
    zero = counter * 0
    bits, _, _, _ = tl.philox(seed, counter, zero, zero + 1, zero)
    u = tl.maximum(tl.uint_to_uniform_float(bits), TINY)
    key = tl.where(top == float("-inf"), float("-inf"), top + ns * (tl.log(total) + _gumbel(u, FAST_LOG)))
    win = tl.max(key, 0)
    chunk = tl.min(tl.where(key == win, c, CHUNKS_P2), 0)  # the first chunk holding it
    QUARTER: tl.constexpr = CHUNK // 4
    i = tl.arange(0, QUARTER)
    logits_row = logits + row * row_stride
    best = tl.full([QUARTER], float("-inf"), tl.float32)
    at = tl.zeros([QUARTER], tl.int32)
    u0, u1, u2, u3 = tl.rand4x(seed, (row * chunks + chunk) * QUARTER + i)
    cols = chunk * CHUNK + i
    # each lane's ids come in increasing order, so a strict > keeps its first
    best, at = _running_max(best, at, logits_row, cols, tl.maximum(u0, TINY), vocab, s, ns, FAST_LOG)
    best, at = _running_max(
        best, at, logits_row, cols + QUARTER, tl.maximum(u1, TINY), vocab, s, ns, FAST_LOG
    )
    best, at = _running_max(
        best, at, logits_row, cols + 2 * QUARTER, tl.maximum(u2, TINY), vocab, s, ns, FAST_LOG
    )
    best, at = _running_max(
        best, at, logits_row, cols + 3 * QUARTER, tl.maximum(u3, TINY), vocab, s, ns, FAST_LOG
    )
    first = tl.min(tl.where(best == tl.max(best, 0), at, 2147483647), 0)
    tl.store(best_value + row, win)
    tl.store(best_index + row, first.to(tl.int64))

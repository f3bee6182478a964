"""Triton kernel of the sampler's Gumbel-max draw (imported on first use: this module imports
Triton, which CPU installs may lack). See :func:`minisgl_core.engine.sampler.gumbel_argmax_chunked`."""

import triton
import triton.language as tl


@triton.jit
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
):
    # program (row, chunk): max and first argmax of logits * scale + noise_scale * gumbel there
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = cols < vocab
    x = tl.load(logits + row * row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.maximum(tl.rand(seed, row * vocab + cols), TINY)
    y = x * tl.load(scale + row) + tl.load(noise_scale + row) * -tl.log(-tl.log(u))
    y = tl.where(mask, y, float("-inf"))
    value, index = tl.max(y, 0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(best_value + row * chunks + chunk, value)
    tl.store(best_index + row * chunks + chunk, chunk * CHUNK + index.to(tl.int64))

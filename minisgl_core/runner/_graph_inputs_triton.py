"""Triton kernel that fills a decode graph's input buffers (imported on first use; see
:func:`minisgl_core.runner.cuda_graph.fill_graph_inputs`)."""

import triton
import triton.language as tl


# Triton compiles one variant per specialisation of an int argument (== 1, divisible by 16): the
# batch and padded sizes change every step, so specialising on them would compile in the middle
# of a run; the dummy slot and spare row are fixed, but may be either.
@triton.jit(do_not_specialize=["bs", "padded", "dummy_slot", "spare_row"])
def graph_inputs_kernel(
    positions_src,  # [>= bs] int64: the batch's, unit stride
    out_cache_loc_src,  # [>= bs] int64
    req_slots_src,  # [>= bs] int32
    seq_lens_src,  # [>= bs] int32
    positions,  # [>= padded] int64: the graph's buffers (out)
    out_cache_loc,  # [>= padded] int64
    req_slots,  # [>= padded] int32
    seq_lens,  # [>= padded] int32
    bs,
    padded,
    dummy_slot,
    spare_row,
    BLOCK: tl.constexpr,
):
    """Entries below ``bs`` are the batch's; from ``bs`` to ``padded`` dummy requests, one token at
    position 0 of the spare row written to the dummy slot; none from ``padded`` on."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    real = i < bs
    inside = i < padded
    tl.store(positions + i, tl.load(positions_src + i, mask=real, other=0), mask=inside)
    tl.store(out_cache_loc + i, tl.load(out_cache_loc_src + i, mask=real, other=dummy_slot), mask=inside)
    tl.store(req_slots + i, tl.load(req_slots_src + i, mask=real, other=spare_row), mask=inside)
    tl.store(seq_lens + i, tl.load(seq_lens_src + i, mask=real, other=1), mask=inside)

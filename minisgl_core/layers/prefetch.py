"""Weights brought into L2 ahead of their product, while the GPU's memory would idle.

At a few tokens a decode step is a stream over the weights, but between two products sit small
kernels bound by their chains of dependent loads (rotary + KV store, attention, its merge, the
norms), during which the HBM does nothing: about 10 µs a layer between the qkv and the o
projection on an H200 at batch 1. Experimental (``MINISGL_L2_PREFETCH_MB``, off by default): right
after the qkv projection a second stream brings the o projection's weight into L2 (and, while the
budget lasts, the first rows of gate/up's), so those products read part of their bytes from L2.

The side stream forks from the model's stream after the qkv projection (it waits for it, so the
prefetch competes with no product) and the model's stream joins it once, at the end of the
forward (:meth:`L2Prefetch.join`): nothing waits for a prefetch, which changes no value. Decode
steps only, where the whole step is one CUDA graph (the piecewise prefill graphs end at each
attention, which a fork must not cross), and CUDA GPUs of compute capability 9.0+ (the bulk
prefetch instruction).
"""

from __future__ import annotations

import functools

import torch

from minisgl_core import environment
from minisgl_core.layers import triton_ops

#: most tokens a step may have for the prefetch to run (beyond, the products read weights less often
#: per flop and the step is no longer a stream over them)
MAX_TOKENS = 8
#: bytes per lane of the bulk prefetch (32 lanes, one warp a program)
_BULK_CHUNK = 16384
_LANES = 32
#: lines a program of the line prefetch covers (4 warps)
_LINE_LANES = 2048


def budget_bytes() -> int:
    """``MINISGL_L2_PREFETCH_MB`` in bytes (0, the default: off)."""
    value = (environment.get("MINISGL_L2_PREFETCH_MB") or "").strip()
    try:
        return max(0, int(float(value) * 2**20)) if value else 0
    except ValueError:
        return 0


def _bulk() -> bool:
    return (environment.get("MINISGL_L2_PREFETCH_KIND") or "bulk").strip().lower() != "line"


@functools.cache
def _supported(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0) and triton_ops.triton_available()


def prefetch_l2(t: torch.Tensor, nbytes: int) -> None:
    """Launch, on the current stream, the prefetch into L2 of ``t``'s first ``nbytes`` bytes
    (rounded down to 16; ``t`` contiguous, on a CUDA device)."""
    nbytes = min(nbytes, t.numel() * t.element_size()) // 16 * 16
    if nbytes <= 0:
        return
    flat = t.view(-1).view(torch.uint8)
    kernels = triton_ops._kernels()
    if _bulk():
        per = _LANES * _BULK_CHUNK
        kernels.l2_prefetch_kernel[(-(-nbytes // per),)](
            flat, nbytes, CHUNK=_BULK_CHUNK, LANES=_LANES, BULK=True, num_warps=1
        )
    else:
        per = _LINE_LANES * 128
        kernels.l2_prefetch_kernel[(-(-nbytes // per),)](
            flat, nbytes, CHUNK=128, LANES=_LINE_LANES, BULK=False, num_warps=4
        )


class L2Prefetch:
    """The side stream of one device and whether a forward forked it."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)
        self.forked = False

    def issue(self, weights: list[torch.Tensor], budget: int) -> None:
        """Prefetch ``weights`` in order, whole, until ``budget`` bytes (the last one's first rows)."""
        main = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(main)
        self.forked = True
        with torch.cuda.stream(self.stream):
            for w in weights:
                if budget <= 0:
                    break
                prefetch_l2(w, budget)
                budget -= w.numel() * w.element_size()

    def join(self) -> None:
        if self.forked:
            torch.cuda.current_stream(self.stream.device).wait_stream(self.stream)
            self.forked = False


_by_device: dict[int, L2Prefetch] = {}


def for_step(x: torch.Tensor, is_prefill: bool) -> L2Prefetch | None:
    """The device's prefetcher when this step prefetches (see the module), else None."""
    if is_prefill or not x.is_cuda or x.shape[0] > MAX_TOKENS or budget_bytes() <= 0:
        return None
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if not _supported(index):
        return None
    if index not in _by_device:
        _by_device[index] = L2Prefetch(torch.device("cuda", index))
    return _by_device[index]


def join(x: torch.Tensor) -> None:
    """The model's stream waits for the side stream if this forward forked it."""
    if x.is_cuda:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        prefetcher = _by_device.get(index)
        if prefetcher is not None:
            prefetcher.join()

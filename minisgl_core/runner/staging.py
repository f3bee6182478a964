"""A step's small host arrays copied to the GPU through pinned staging memory.

A non-blocking copy from pageable host memory is staged by the CUDA driver itself, synchronously:
on the GPU machine each such copy cost the host 26-72 µs, nine of them a decode step, 0.2-0.36 ms
of a step's host time (``tools/device_profile.py steps``, BENCHMARKS.md, twenty-seventh session),
which is what the end of an offline run, with few requests left, waits for. ``Tensor.pin_memory()``
costs about as much (a block from PyTorch's caching host allocator, then the copy into it: 33 +
17 µs in the same profile).

:class:`PinnedStaging` keeps one pinned buffer cut into segments and hands out 64-byte-aligned
pieces of the current one; the copy to the device reads the piece after the host has moved on, so
a piece is only written again once the copies read from it have run: when the ring leaves a
segment it records an event on every stream that copied from it, and before it writes a segment
again it waits for those events (long passed, normally: the other segments were filled since).

Experimental and off by default until measured on the GPU (``MINISGL_PINNED_H2D=1`` turns it on);
other devices always copy directly, as does a stream being captured into a CUDA graph (a captured
copy would read the piece at every replay).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from minisgl_core import environment


class PinnedStaging:
    """A ring of ``segments`` pieces of one host buffer (pinned unless ``pin`` is false: the tests)."""

    def __init__(self, nbytes: int = 4 << 20, segments: int = 8, *, pin: bool = True) -> None:
        self.segment_bytes = nbytes // segments
        self.segments = segments
        self.buffer = torch.empty(self.segment_bytes * segments, dtype=torch.uint8, pin_memory=pin)
        self.segment = 0
        self.offset = 0
        #: per segment: the streams that copied from it since it was last entered
        self.streams: list[set[Any]] = [set() for _ in range(segments)]
        #: per segment: the events recorded when the ring last left it
        self.events: list[list[Any]] = [[] for _ in range(segments)]
        self.lock = threading.Lock()

    # overridden by the tests, which run without CUDA
    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def stage(self, host: torch.Tensor) -> torch.Tensor | None:
        """A copy of contiguous CPU tensor ``host`` in the buffer (a view of it), or None where it
        is empty or larger than a segment. The caller copies from it at once, then :meth:`used`."""
        nbytes = host.numel() * host.element_size()
        size = -(-nbytes // 64) * 64
        if nbytes == 0 or size > self.segment_bytes:
            return None
        if self.offset + size > self.segment_bytes:
            self._advance()
        start = self.segment * self.segment_bytes + self.offset
        self.offset += size
        piece = self.buffer[start : start + nbytes].view(host.dtype).view(host.shape)
        piece.copy_(host)
        return piece

    def used(self, stream: Any) -> None:
        """A copy from the current segment was issued on ``stream``."""
        self.streams[self.segment].add(stream)

    def _advance(self) -> None:
        leaving = self.segment
        self.events[leaving] = [self.record_event(stream) for stream in self.streams[leaving]]
        self.streams[leaving] = set()
        self.segment = (leaving + 1) % self.segments
        for event in self.events[self.segment]:
            event.synchronize()  # the copies that last read this segment have run
        self.events[self.segment] = []
        self.offset = 0

    def copy(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``host`` on ``device``, copied from a staged piece where it fits, else directly."""
        with self.lock:
            piece = self.stage(host)
            if piece is None:
                return host.to(device, non_blocking=True)
            out = torch.empty(host.shape, dtype=host.dtype, device=device)
            out.copy_(piece, non_blocking=True)
            self.used(self.current_stream(device))
            return out


_rings: dict[int, PinnedStaging] = {}
_rings_lock = threading.Lock()


def pinned_h2d_enabled(device: torch.device) -> bool:
    """Whether :func:`copy_to_device` stages through pinned memory (``MINISGL_PINNED_H2D=1``, CUDA)."""
    return device.type == "cuda" and environment.get("MINISGL_PINNED_H2D", "0") == "1"


def copy_to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A contiguous CPU tensor on ``device`` without waiting for the device (a non-blocking copy),
    through :class:`PinnedStaging` where :func:`pinned_h2d_enabled`."""
    device = torch.device(device)
    if not pinned_h2d_enabled(device) or torch.cuda.is_current_stream_capturing():
        return host.to(device, non_blocking=True)
    index = device.index if device.index is not None else torch.cuda.current_device()
    ring = _rings.get(index)
    if ring is None:
        with _rings_lock:
            ring = _rings.setdefault(index, PinnedStaging())
    return ring.copy(host.contiguous(), torch.device("cuda", index))

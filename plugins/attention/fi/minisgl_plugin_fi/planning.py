"""When it is safe to call FlashInfer's ``plan()``.

``plan()`` reads the indptr arrays on the host, and copies any device tensor it is given there
(one device sync each): the backends hand it ``batch.host_layout`` (CPU tensors the core computes
from the batch's Python-side lengths) and the page ids of ``batch.layout`` (on the device).

- :class:`PlanFences`: ``plan()`` stages its schedule in a pinned buffer owned by the wrapper and
  copies it to the GPU with ``cudaMemcpyAsync``, without waiting. Re-planning a wrapper before the
  GPU has run that copy (a CPU a step ahead, as with overlap scheduling) would overwrite the
  schedule of the step still queued, so each plan waits for the previous plan's copy of the same
  wrapper; when the GPU is not behind, that wait returns at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def int32(values: list[int]) -> torch.Tensor:
    """A CPU int32 tensor."""
    return torch.tensor(values, dtype=torch.int32)


class PlanFences:
    """One CUDA event per wrapper, recorded on the current stream right after its ``plan()``."""

    def __init__(self) -> None:
        self._events: dict[int, torch.cuda.Event] = {}

    @contextmanager
    def planning(self, wrapper: object) -> Iterator[None]:
        event = self._events.get(id(wrapper))
        if event is not None:
            event.synchronize()
        yield
        self._events.setdefault(id(wrapper), torch.cuda.Event()).record()

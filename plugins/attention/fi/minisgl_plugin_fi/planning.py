"""What FlashInfer's ``plan()`` needs besides the device page layout, and when it is safe to call.

- :func:`host_csr`: the indptr arrays as CPU tensors. ``plan()`` reads them on the host, and
  copies any device tensor it is given there (one device sync each); the batch's Python-side
  lengths give them for free. The page ids (``kv_indices``) stay on the device, from
  :func:`minisgl_core.api.paged_layout`.
- :class:`PlanFences`: ``plan()`` stages its schedule in a pinned buffer owned by the wrapper and
  copies it to the GPU with ``cudaMemcpyAsync``, without waiting. Re-planning a wrapper before the
  GPU has run that copy (a CPU a step ahead, as with overlap scheduling) would overwrite the
  schedule of the step still queued, so each plan waits for the previous plan's copy of the same
  wrapper; when the GPU is not behind, that wait returns at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from minisgl_core.api import ForwardBatch


class HostCSR(NamedTuple):
    """CPU int32 twins of :class:`minisgl_core.api.PagedLayout`'s offsets."""

    #: [bs + 1] offsets of each sequence's new tokens
    qo_indptr: torch.Tensor
    #: [bs + 1] offsets into the page ids
    kv_indptr: torch.Tensor
    #: [bs] tokens used in each sequence's last page (1..page_size)
    kv_last_page_len: torch.Tensor


def int32(values: list[int]) -> torch.Tensor:
    """A CPU int32 tensor."""
    return torch.tensor(values, dtype=torch.int32)


def host_csr(batch: ForwardBatch, page_size: int) -> HostCSR:
    pages = [(n + page_size - 1) // page_size for n in batch.seq_lens_cpu]
    return HostCSR(
        qo_indptr=int32([0, *itertools.accumulate(batch.extend_lens_cpu)]),
        kv_indptr=int32([0, *itertools.accumulate(pages)]),
        kv_last_page_len=int32([(n - 1) % page_size + 1 for n in batch.seq_lens_cpu]),
    )


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

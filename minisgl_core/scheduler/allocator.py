"""KV-pool page allocator and the request-slot table (rows of the page table)."""

from __future__ import annotations

import torch


class PageAllocator:
    """Free pages of the KV pool. Slots of page ``p`` are ``p * page_size ... + page_size - 1``."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        # Low page ids first, so small runs stay compact; pop from the end is O(1).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"KV pool exhausted: asked for {n} pages, {len(self._free)} free")
        pages = self._free[-n:] if n else []
        del self._free[len(self._free) - n :]
        return pages

    def free_pages_list(self, pages: list[int]) -> None:
        self._free.extend(pages)

    def free_slots(self, slots: torch.Tensor) -> None:
        """Free the pages holding ``slots`` (whole pages only: callers pass page-aligned runs)."""
        if slots.numel():
            self._free.extend(torch.unique(slots // self.page_size).tolist())


class RequestSlots:
    """Rows of the page table, one per request in flight."""

    def __init__(self, num_rows: int) -> None:
        self._free = list(range(num_rows - 1, -1, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        return self._free.pop()

    def release(self, row: int) -> None:
        self._free.append(row)

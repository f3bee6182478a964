"""KV accounting: admission against free + evictable memory, page allocation, release into the cache.

A request is admitted only when the pool can hold its whole future (remaining prompt plus
``max_tokens``), counting pages promised to running requests as taken; so a running request
never waits for memory and nothing accepted is ever dropped. Pages are allocated lazily, and
unlocked cache entries are evicted (LRU) only when the free list runs short.
"""

from __future__ import annotations

import torch

from minisgl_core.api import CacheManager
from minisgl_core.engine.allocator import PageAllocator
from minisgl_core.scheduler.request import Request


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class KVManager:
    def __init__(self, allocator: PageAllocator, cache: CacheManager, page_size: int) -> None:
        self.allocator = allocator
        self.cache = cache
        self.page_size = page_size
        self.reserved_pages = 0
        #: prompt tokens admitted, and how many of them came from the prefix cache
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._offsets = torch.arange(page_size, dtype=torch.int64)

    # ------------------------------------------------------------ accounting

    def available_pages(self) -> int:
        """Pages a new request may still be promised."""
        evictable = self.cache.size_info().evictable // self.page_size
        return self.allocator.free_pages + evictable - self.reserved_pages

    def pages_needed(self, req: Request, prefix_len: int) -> int:
        final_len = req.prompt_len + req.params.max_tokens
        return ceil_div(final_len, self.page_size) - prefix_len // self.page_size

    def used_tokens(self) -> int:
        """KV tokens not free: held by running requests or by the cache."""
        return (self.allocator.num_pages - self.allocator.free_pages) * self.page_size

    def cached_prefix_len(self, tokens: list[int]) -> int:
        return self._usable_prefix(len(self.cache.match_prefix(tokens).slots), len(tokens))

    def _usable_prefix(self, matched: int, prompt_len: int) -> int:
        # At least one prompt token must run through the model to produce the first output logits.
        return min(matched, (prompt_len - 1) // self.page_size * self.page_size)

    # ------------------------------------------------------------ admission

    def admit(self, req: Request) -> bool:
        """Match and lock the cached prefix and promise the rest of the request's pages."""
        match = self.cache.match_prefix(req.prompt_ids)
        self.cache.lock(match.handle)
        prefix_len = self._usable_prefix(len(match.slots), req.prompt_len)
        need = self.pages_needed(req, prefix_len)
        if need > self.available_pages():
            self.cache.unlock(match.handle)
            return False
        req.prefix_handle = match.handle
        req.prefix_slots = match.slots[:prefix_len]
        req.prefix_len = prefix_len
        req.num_computed = prefix_len
        req.reserved_pages = need
        self.reserved_pages += need
        self.prompt_tokens += req.prompt_len
        self.cached_tokens += prefix_len
        return True

    # ------------------------------------------------------------ allocation

    def allocate(self, req: Request, end: int) -> list[int]:
        """Slots for positions [req.num_computed, end), allocating pages as needed.

        Plain Python ints: this runs for every request of every decode step, where building
        tiny tensors would cost more than the arithmetic."""
        start = req.num_computed
        page_size = self.page_size
        have = req.prefix_len + len(req.pages) * page_size
        if end > have:
            n = ceil_div(end - have, page_size)
            if n > req.reserved_pages:
                raise RuntimeError(f"request {req.rid} outgrew its KV reservation")
            short = n - self.allocator.free_pages
            if short > 0:
                self.allocator.free_slots(self.cache.evict(short * page_size))
            req.pages.extend(self.allocator.alloc(n))
            req.reserved_pages -= n
            self.reserved_pages -= n
        base, pages = req.prefix_len, req.pages
        if end - start == 1:
            own = start - base
            return [pages[own // page_size] * page_size + own % page_size]
        return [pages[(pos - base) // page_size] * page_size + (pos - base) % page_size for pos in range(start, end)]

    def slots_of(self, req: Request, end: int) -> torch.Tensor:
        """Slots of positions [0, end) (CPU int64)."""
        own = (torch.tensor(req.pages, dtype=torch.int64)[:, None] * self.page_size + self._offsets).flatten()
        return torch.cat([req.prefix_slots, own])[:end]

    # ------------------------------------------------------------ sharing a prompt early

    def cache_prompt(self, req: Request, page_table: torch.Tensor) -> None:
        """Offer a just-prefilled prompt to the cache, so requests sharing it hit while this one
        still decodes. The request then reads the cached copy: its lock moves to the new entry,
        its page-table row points at the cache's slots, and its pages the cache did not keep
        (positions another request cached first) are freed."""
        if "prefix_reuse" not in self.cache.capabilities:
            return
        aligned = req.prompt_len // self.page_size * self.page_size
        if aligned <= req.prefix_len:
            return
        tokens = req.prompt_ids[:aligned]
        self.allocator.free_slots(self.cache.insert_prefix(tokens, self.slots_of(req, aligned)))
        match = self.cache.match_prefix(tokens)
        self.cache.lock(match.handle)
        self.cache.unlock(req.prefix_handle)
        cached = len(match.slots)
        page_table[req.row, :cached] = match.slots.to(page_table.device, torch.int32)
        req.pages = req.pages[(cached - req.prefix_len) // self.page_size :]
        req.prefix_handle, req.prefix_slots, req.prefix_len = match.handle, match.slots, cached

    # ------------------------------------------------------------ release

    def release(self, req: Request) -> None:
        """Give a finished request's KV to the cache (page-aligned part) and the allocator (rest)."""
        if not req.admitted:
            return
        kv_len = req.num_computed
        aligned = kv_len // self.page_size * self.page_size
        all_slots = self.slots_of(req, len(req.pages) * self.page_size + req.prefix_len)
        tokens = req.all_ids()[:aligned]
        if aligned:
            self.allocator.free_slots(self.cache.insert_prefix(tokens, all_slots[:aligned]))
        # The pages past the aligned part (partly written or never used) return to the allocator.
        tail_pages = req.pages[(max(aligned, req.prefix_len) - req.prefix_len) // self.page_size :]
        self.allocator.free_pages_list(tail_pages)
        self.cache.unlock(req.prefix_handle)
        self.reserved_pages -= req.reserved_pages
        req.reserved_pages = 0
        req.pages = []
        req.prefix_handle = None

"""KV accounting: admission against free + evictable memory, page allocation, release into the cache.

A request is admitted when the pool can hold its remaining prompt plus an expected share
(``output_reserve_ratio``) of its remaining ``max_tokens``, counting the expected growth of every
admitted request as taken. The ratio falls while requests finish early and jumps back up when
decode runs out of pages, in which case the scheduler retracts the least urgent running request
(largest ``priority``; the newest among equals): its KV goes to the prefix cache and it later
resumes from there, so nothing accepted is dropped. Pages are allocated lazily; unlocked cache
entries are evicted (LRU) only when the free list runs short.

The prefix cache is searched once per admission: the match the policy's ``cached_prefix_len``
asked for is remembered and is the one :meth:`KVManager.admit` locks, until the cache changes
(an insert or an eviction, all of which go through this class) or the next scheduling round.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from math import ceil

import torch

from minisgl_core.api import CacheManager, CacheSize, PrefixMatch
from minisgl_core.plugin_results import WrongResult, shown
from minisgl_core.runner.sampler import to_device
from minisgl_core.scheduler.allocator import PageAllocator
from minisgl_core.scheduler.request import Request


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


#: output_reserve_ratio: where it starts, its floor, how much each decode step lowers it
RESERVE_INITIAL, RESERVE_MIN, RESERVE_DECAY = 0.7, 0.2, 0.002


def pages_still_needed(reqs: Iterable[Request], ratio: float, page_size: int) -> list[int]:
    """The pages each of ``reqs`` is still expected to need (the one place a request's expected
    growth is computed): those its expected final length spans past the whole pages of its cached
    prefix and the pages it holds. Its expected final length is what it has plus ``ratio`` of what
    it may still add (``max_tokens`` less its output), and at least one token past what it must
    fill. One loop for many requests: the KV manager sums hundreds every step, where a call a
    request cost more than the arithmetic (and comparisons, not ``max``: its two calls a request
    were a third of the loop's time on the dev CPU)."""
    needs: list[int] = []
    append = needs.append
    for r in reqs:
        out = len(r.output_ids)
        final = len(r.prompt_ids) + out + ceil(ratio * (r.params.max_tokens - out))
        if final <= len(r.fill_ids):
            final = len(r.fill_ids) + 1
        need = -(-final // page_size) - r.prefix_len // page_size - len(r.pages)
        append(need if need > 0 else 0)
    return needs


def _count(value: object) -> int | None:
    """``value`` as a token count: a non-negative integer (an int, a numpy int; not a bool or a
    float), else None."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    count = operator.index(value)  # type: ignore[arg-type]
    return count if count >= 0 else None


class KVManager:
    def __init__(self, allocator: PageAllocator, cache: CacheManager, page_size: int) -> None:
        self.allocator = allocator
        self.cache = cache
        self.page_size = page_size
        self.reserve_ratio = RESERVE_INITIAL
        #: requests holding a page-table row, by rid
        self.admitted: dict[int, Request] = {}
        self.retractions = 0
        #: prompt tokens admitted, and how many of them came from the prefix cache
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._offsets = torch.arange(page_size, dtype=torch.int64)
        #: this round's prefix matches by rid, with the token list each matched; emptied whenever
        #: the cache changes, since a match may then be stale (shorter, or its entry evicted)
        self._matches: dict[int, tuple[list[int], PrefixMatch]] = {}
        #: pages each admitted request is still expected to need (by rid), and their sum: summed
        #: once per round (a step's outputs and the reserve ratio change them all) and kept up to
        #: date within it, as admissions and allocations change single requests; None: not summed
        self._growth: dict[int, int] | None = None
        self._growth_total = 0

    # ------------------------------------------------------------ accounting

    def available_pages(self) -> int:
        """Pages a new request may still be promised: free and evictable pages minus the pages every
        admitted request is still expected to need (asked every step, for hundreds of requests,
        and at every admission of a prefill step: summed once a round, see :attr:`_growth`)."""
        if self._growth is None:
            admitted = self.admitted
            needs = pages_still_needed(admitted.values(), self.reserve_ratio, self.page_size)
            self._growth, self._growth_total = dict(zip(admitted, needs)), sum(needs)
        evictable = self.size_info().evictable // self.page_size
        return self.allocator.free_pages + evictable - self._growth_total

    def _still_needed(self, req: Request) -> int:
        return pages_still_needed((req,), self.reserve_ratio, self.page_size)[0]

    def _regrow(self, req: Request) -> None:
        """``req`` was admitted or released, or its pages or prefix changed: its share of the sum."""
        if self._growth is None:
            return
        need = self._still_needed(req) if req.rid in self.admitted else 0
        self._growth_total += need - self._growth.pop(req.rid, 0)
        if req.rid in self.admitted:
            self._growth[req.rid] = need

    def _forget_growth(self) -> None:
        self._growth = None

    def obtainable_pages(self) -> int:
        """Pages allocate() can get right now (free, then by evicting unlocked cache entries)."""
        return self.allocator.free_pages + self.size_info().evictable // self.page_size

    def decayed(self) -> None:
        """One decode step went by: expect a little less output from everyone."""
        self.reserve_ratio = max(RESERVE_MIN, self.reserve_ratio - RESERVE_DECAY)
        self._forget_growth()

    def retracted(self) -> None:
        """Decode ran out of pages: reserve for all of max_tokens again until requests prove otherwise."""
        self.reserve_ratio = 1.0
        self.retractions += 1
        self._forget_growth()

    def used_tokens(self) -> int:
        """KV tokens not free: held by running requests or by the cache."""
        return (self.allocator.num_pages - self.allocator.free_pages) * self.page_size

    def match(self, req: Request) -> PrefixMatch:
        """The cache's match for what the request must fill, searched once while the cache does
        not change: the policy's question and the admission that follows share it."""
        seen = self._matches.get(req.rid)
        if seen is not None and seen[0] is req.fill_ids:
            return seen[1]
        match = self._match_prefix(req.cache_key(req.fill_ids))
        self._matches[req.rid] = (req.fill_ids, match)
        return match

    def new_round(self) -> None:
        """A scheduling round starts: forget the last one's matches (and requests gone since) and
        expected growth (outputs landed since)."""
        self._matches.clear()
        self._forget_growth()

    def cached_prefix_len(self, req: Request) -> int:
        return self._usable_prefix(len(self.match(req).slots), req.fill_len)

    def _usable_prefix(self, matched: int, prompt_len: int) -> int:
        # At least one prompt token must run through the model to produce the first output logits.
        return min(matched, (prompt_len - 1) // self.page_size * self.page_size)

    # ------------------------------------------------------------ the cache's answers, checked
    # The allocator and the page table read the slots a cache returns: a list from insert_prefix
    # was an AttributeError in the allocator naming no plugin. WrongResult names the cache
    # (engine/plugin_failures.py); the checks cost a few attribute reads a call, not per token.

    def _match_prefix(self, tokens: list[int]) -> PrefixMatch:
        match = self.cache.match_prefix(tokens)
        slots = getattr(match, "slots", None)
        if slots is None:
            raise WrongResult(
                self.cache, "caches", f"match_prefix returned {shown(match)}, not a PrefixMatch"
            )
        self._slots("match_prefix", slots, "a PrefixMatch whose slots are ")
        return match

    def size_info(self) -> CacheSize:
        """The cache's ``size_info`` as two ints (a plain tuple was an AttributeError in the
        admission arithmetic, a float or a negative count skewed it without a word); WrongResult
        naming the cache if it is not two non-negative integer token counts."""
        size = self.cache.size_info()
        counts = [_count(getattr(size, name, None)) for name in ("evictable", "protected")]
        if None not in counts:
            return CacheSize(*counts)  # type: ignore[arg-type]
        what = repr(size) if isinstance(size, tuple) and len(repr(size)) <= 80 else shown(size)
        raise WrongResult(
            self.cache,
            "caches",
            f"size_info returned {what}, not a CacheSize of two non-negative integer token counts",
        )

    def _insert_prefix(self, tokens: list[int], slots: torch.Tensor) -> None:
        """Offer ``slots`` to the cache; free those it did not keep."""
        self.allocator.free_slots(self._slots("insert_prefix", self.cache.insert_prefix(tokens, slots)))

    def _slots(self, method: str, slots: object, part: str = "") -> torch.Tensor:
        """``slots`` as the cache's ``method`` returned them, in the API's form (1-D int64 on the
        CPU, as the cache kit's ``slot_list`` checks them); WrongResult naming the cache if not."""
        if (
            isinstance(slots, torch.Tensor)
            and slots.dim() == 1
            and slots.dtype == torch.int64
            and slots.device.type == "cpu"
        ):
            return slots
        raise WrongResult(
            self.cache, "caches", f"{method} returned {part}{shown(slots)}, not a 1-D int64 CPU tensor"
        )

    # ------------------------------------------------------------ admission

    def admit(self, req: Request) -> bool:
        """Lock the cached prefix (the round's one match) if the request's expected KV fits."""
        match = self.match(req)
        prefix_len = self._usable_prefix(len(match.slots), req.fill_len)
        if req.scores_prompt:  # every prompt position's logits are needed
            prefix_len = 0
        if prefix_len < len(match.slots):
            # Lock only the part it reads: a locked tail (the last prompt token's page, run again
            # for its logits; the whole match for a scored prompt) would count as taken, not as
            # evictable, and a prompt cached whole in a pool just its size then never fitted.
            # (matching the shorter list ends the handle there; other matches stay valid)
            match = self._match_prefix(req.cache_key(req.fill_ids[:prefix_len]))
        self.cache.lock(match.handle)
        # (not admitted, it holds no page and no prefix: its growth is all it would take, less
        # the pages of the prefix it would read)
        need = self._still_needed(req) - prefix_len // self.page_size
        if need > self.available_pages():
            self.cache.unlock(match.handle)
            return False
        req.prefix_handle = match.handle
        req.prefix_slots = match.slots[:prefix_len]
        req.prefix_len = prefix_len
        req.num_computed = prefix_len
        self.admitted[req.rid] = req
        self._regrow(req)
        self.prompt_tokens += req.fill_len
        self.cached_tokens += prefix_len
        return True

    # ------------------------------------------------------------ allocation

    def pages_to_reach(self, req: Request, end: int) -> int:
        have = req.prefix_len + len(req.pages) * self.page_size
        return ceil_div(end - have, self.page_size) if end > have else 0

    def allocate(self, req: Request, end: int) -> list[int] | None:
        """Slots for positions [req.num_computed, end), allocating pages as needed; None (and
        nothing allocated) when the pool cannot supply them even after evicting the cache.

        Plain Python ints: this runs for every request of every decode step, where building
        tiny tensors would cost more than the arithmetic."""
        start = req.num_computed
        page_size = self.page_size
        n = self.pages_to_reach(req, end)
        if n:
            new = self._take_pages(n)
            if new is None:
                return None
            req.pages.extend(new)
            self._regrow(req)
        base, pages = req.prefix_len, req.pages
        if end - start == 1:
            own = start - base
            return [pages[own // page_size] * page_size + own % page_size]
        # a prefill chunk: one range per page it touches (a per-position list comprehension cost
        # 1.5 ms for an 8,192-token step on the dev CPU, this 0.5)
        slots: list[int] = []
        own, stop = start - base, end - base
        while own < stop:
            page, offset = divmod(own, page_size)
            first = pages[page] * page_size + offset
            count = min(page_size - offset, stop - own)
            slots.extend(range(first, first + count))
            own += count
        return slots

    def _take_pages(self, n: int) -> list[int] | None:
        """``n`` free pages, evicting unlocked cache entries if the free list is short; None (and
        nothing taken) when even that is not enough."""
        short = n - self.allocator.free_pages
        if short > 0:
            self._matches.clear()
            self.allocator.free_slots(self._slots("evict", self.cache.evict(short * self.page_size)))
        if n > self.allocator.free_pages:
            return None
        return self.allocator.alloc(n)

    def flush(self) -> int:
        """Evict every unlocked cache entry: the prefix cache emptied of all that no admitted
        request holds. The number of tokens freed."""
        evictable = self.size_info().evictable
        if not evictable:
            return 0
        self._matches.clear()
        slots = self._slots("evict", self.cache.evict(evictable))
        self.allocator.free_slots(slots)
        return len(slots)

    def needing_a_page(self, reqs: list[Request]) -> int:
        """How many of ``reqs`` start a new page with their next token (``pages_to_reach(r,
        r.num_computed + 1) > 0``), counted in one loop: decode asks every step."""
        ps = self.page_size
        return sum(1 for r in reqs if r.num_computed + 1 > r.prefix_len + len(r.pages) * ps)

    def decode_slots(self, reqs: list[Request]) -> list[int] | None:
        """The slot of each request's next position (``num_computed``): :meth:`allocate` for one
        position of many requests, with the new pages (where a page starts) taken in one go;
        None, and nothing allocated, when the pool cannot supply them."""
        ps = self.page_size
        out: list[int] = []
        fresh: list[int] = []  # indices of requests whose next position starts a page
        for i, r in enumerate(reqs):
            own = r.num_computed - r.prefix_len
            page = own // ps
            if page < len(r.pages):
                out.append(r.pages[page] * ps + own % ps)
            elif page == len(r.pages) and own % ps == 0:
                out.append(-1)
                fresh.append(i)
            else:  # decode grows one position at a time, so this does not happen
                raise RuntimeError(f"request {r.rid}: position {r.num_computed} is past its pages")
        if fresh:
            pages = self._take_pages(len(fresh))
            if pages is None:
                return None
            for i, page in zip(fresh, pages, strict=True):
                reqs[i].pages.append(page)
                out[i] = page * ps
                self._regrow(reqs[i])
        return out

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
        aligned = req.fill_len // self.page_size * self.page_size
        if aligned <= req.prefix_len:
            return
        tokens = req.cache_key(req.fill_ids[:aligned])
        self._matches.clear()
        self._insert_prefix(tokens, self.slots_of(req, aligned))
        match = self._match_prefix(tokens)
        self.cache.lock(match.handle)
        self.cache.unlock(req.prefix_handle)
        cached = len(match.slots)
        # (to_device: a plain copy waits for every kernel queued before it, which made each prefill
        # step wait for the one in flight; tools/device_sync_probe.py found it)
        page_table[req.row, :cached] = to_device(match.slots, page_table.device, torch.int32)
        req.pages = req.pages[(cached - req.prefix_len) // self.page_size :]
        req.prefix_handle, req.prefix_slots, req.prefix_len = match.handle, match.slots, cached
        self._regrow(req)

    # ------------------------------------------------------------ release

    def release(self, req: Request) -> None:
        """Give a finished request's KV to the cache (page-aligned part) and the allocator (rest)."""
        if not req.admitted:
            return
        kv_len = req.num_computed
        aligned = kv_len // self.page_size * self.page_size
        all_slots = self.slots_of(req, len(req.pages) * self.page_size + req.prefix_len)
        tokens = req.cache_key(req.all_ids()[:aligned])
        if aligned:
            self._matches.clear()
            self._insert_prefix(tokens, all_slots[:aligned])
        # The pages past the aligned part (partly written or never used) return to the allocator.
        tail_pages = req.pages[(max(aligned, req.prefix_len) - req.prefix_len) // self.page_size :]
        self.allocator.free_pages_list(tail_pages)
        self.cache.unlock(req.prefix_handle)
        self.admitted.pop(req.rid, None)
        self._regrow(req)
        req.pages = []
        req.prefix_handle = None
        req.prefix_slots = req.prefix_slots[:0]
        req.prefix_len = 0

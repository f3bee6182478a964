"""Conformance suite that every :class:`~minisgl_core.api.CacheManager` plugin runs.

Subclass :class:`CacheManagerSuite` in a test module and set ``cache_cls`` (and, if needed,
``page_sizes``)::

    class TestMyCache(CacheManagerSuite):
        cache_cls = MyCache      # or "module:Class", or the name your plugin registers ("mine")

It runs a randomized model of how the core drives a cache (:class:`CacheUsageModel`: requests
match, lock, allocate, decode, insert, free and unlock while others run; eviction under pool
pressure) against a reference of which slot the cache holds for which position, plus example tests for the
behaviours the contract names. Tests that need a capability the class does not declare (for
example ``"prefix_reuse"``) are skipped, not failed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from minisgl_core.api import CacheManager, PrefixMatch
from minisgl_core.testing.targets import build, resolve

PREFIX_REUSE = "prefix_reuse"
#: a small alphabet, so random prompts share prefixes often
_TOKEN = st.integers(0, 2)
#: (tokens up to the end of a position's page, offset in that page): names one cacheable position
Position = tuple[tuple[int, ...], int]


def slot_tensor(values: Iterable[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def slot_list(slots: torch.Tensor) -> list[int]:
    """The slots as Python ints, checking they have the contract's form (1-D int64 on CPU)."""
    assert isinstance(slots, torch.Tensor), f"slots must be a tensor, got {type(slots).__name__}"
    assert slots.dtype == torch.int64 and slots.dim() == 1, f"slots must be 1-D int64, got {slots.dtype}"
    assert slots.device.type == "cpu", f"slots must be on CPU, got {slots.device}"
    return slots.tolist()


@dataclass
class _Request:
    tokens: list[int]
    slots: list[int]  # one per token: the matched prefix's cached slots, then the request's own
    matched: int
    handle: Any


class CacheUsageModel(RuleBasedStateMachine):
    """The core's use of a cache over a pool of ``num_slots`` KV slots, checked against a reference.

    The reference ``cached`` maps each position the cache holds to its slot. A position is named
    by the tokens up to the end of its page and its offset in the page, since a cache compares
    whole pages: ``[0, 0]`` and ``[0, 1]`` with page_size 2 share no position, not even the first.
    Every slot is always in exactly one of: the allocator's free set, the cache, or the own
    (unmatched) part of a running request."""

    # Set on a per-run subclass by CacheManagerSuite.test_random_usage.
    make_cache: ClassVar[Callable[[], CacheManager]]
    page_size: ClassVar[int]
    prefix_reuse: ClassVar[bool]
    num_slots: ClassVar[int] = 32
    max_running: ClassVar[int] = 5

    def __init__(self) -> None:
        super().__init__()
        self.cache = self.make_cache()
        self.free: set[int] = set(range(self.num_slots))
        self.cached: dict[Position, int] = {}
        self.position_of: dict[int, Position] = {}
        self.running: dict[int, _Request] = {}
        self.history: list[list[int]] = []
        self.next_id = 0

    # ---- rules ---------------------------------------------------------------------------------

    @precondition(lambda self: len(self.running) < self.max_running)
    @rule(data=st.data())
    def start_request(self, data: st.DataObject) -> None:
        tokens = self._draw_prompt(data)
        self.history.append(list(tokens))
        match = self.cache.match_prefix(tokens)
        matched = self._check_match(tokens, match)
        self.cache.lock(match.handle)
        request = _Request(tokens, matched, len(matched), match.handle)
        request_id, self.next_id = self.next_id, self.next_id + 1
        # Registered before allocating: its matched prefix is locked and must survive that eviction.
        self.running[request_id] = request
        fresh = self._allocate(len(tokens) - len(matched))
        if fresh is None:  # pool exhausted even after eviction: the core keeps it waiting instead
            del self.running[request_id]
            self.cache.unlock(match.handle)
            return
        request.slots += fresh

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def decode_token(self, data: st.DataObject) -> None:
        request = self.running[data.draw(st.sampled_from(sorted(self.running)), label="request")]
        fresh = self._allocate(1)
        if fresh is not None:
            request.tokens.append(data.draw(_TOKEN, label="token"))
            request.slots += fresh

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.running)), label="request")
        request = self.running.pop(request_id)
        self.history.append(list(request.tokens))  # what is now cached: the likeliest to be matched
        self._finish(request)

    @rule(num_tokens=st.integers(0, 24))
    def evict(self, num_tokens: int) -> None:
        self._evict(num_tokens)

    @rule(data=st.data())
    def probe(self, data: st.DataObject) -> None:
        """A match that is never locked (a request that is then not admitted)."""
        tokens = self._draw_prompt(data)
        self._check_match(tokens, self.cache.match_prefix(tokens))

    # ---- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_slot_has_one_owner(self) -> None:
        own = [s for r in self.running.values() for s in r.slots[r.matched :]]
        owners = sorted([*self.free, *self.position_of, *own])
        assert owners == list(range(self.num_slots)), "a slot leaked or has two owners"
        for request in self.running.values():
            for i in range(request.matched):
                assert self.cached.get(self._position(request.tokens, i)) == request.slots[i], (
                    "a running request's locked prefix is no longer cached under its slots"
                )

    @invariant()
    def sizes_match_the_reference(self) -> None:
        protected = len(self._locked_prefixes())
        expected = (len(self.cached) - protected, protected)
        assert tuple(self.cache.size_info()) == expected, f"size_info {self.cache.size_info()} != {expected}"

    @invariant()
    def cache_is_consistent(self) -> None:
        self.cache.check_integrity()
        # The cache holds whole pages, each with the pages before it (else it could never match).
        page = self.page_size
        for tokens, offset in self.cached:
            assert all((tokens, o) in self.cached for o in range(page)), f"partial page cached: {tokens}"
            assert len(tokens) == page or (tokens[:-page], offset) in self.cached, f"orphan page: {tokens}"

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:
            return  # a step already failed; do not mask its error with a second one
        for request_id in sorted(self.running):
            self._finish(self.running.pop(request_id))
        self._evict(self.num_slots)
        assert not self.cached, f"{len(self.cached)} unlocked tokens were not evicted by evict(all)"
        assert self.free == set(range(self.num_slots)), "slots were lost once everything was freed"
        assert tuple(self.cache.size_info()) == (0, 0)

    # ---- helpers -------------------------------------------------------------------------------

    def _draw_prompt(self, data: st.DataObject) -> list[int]:
        # Mostly a cut of an earlier prompt plus a new tail, so prompts share whole pages often.
        if self.history and data.draw(st.integers(0, 3), label="fresh prompt unless 0") != 0:
            base = data.draw(st.sampled_from(self.history), label="base")
            cut = data.draw(st.integers(0, len(base)), label="cut")
            tokens = base[:cut] + data.draw(st.lists(_TOKEN, max_size=8), label="suffix")
            return tokens or [0]
        return data.draw(st.lists(_TOKEN, min_size=1, max_size=16), label="prompt")

    def _position(self, tokens: list[int], index: int) -> Position:
        page_end = index - index % self.page_size + self.page_size
        return tuple(tokens[:page_end]), index % self.page_size

    def _locked_prefixes(self) -> set[Position]:
        return {self._position(r.tokens, i) for r in self.running.values() for i in range(r.matched)}

    def _check_match(self, tokens: list[int], match: PrefixMatch) -> list[int]:
        slots = slot_list(match.slots)
        page = self.page_size
        assert len(slots) % page == 0, f"match of {len(slots)} tokens is not whole pages of {page}"
        assert len(slots) <= len(tokens), "match longer than the prompt"
        for i, slot in enumerate(slots):
            expected = self.cached.get(self._position(tokens, i))
            assert slot == expected, f"match slot {i} is {slot}, the cache was given {expected} for it"
        end = len(slots)
        if self.prefix_reuse and end + page <= len(tokens):
            next_page = [self._position(tokens, j) in self.cached for j in range(end, end + page)]
            assert not all(next_page), f"match stopped at {end} although the next page is cached"
        return slots

    def _allocate(self, count: int) -> list[int] | None:
        if len(self.free) < count:
            self._evict(count - len(self.free))
        if len(self.free) < count:
            return None
        chosen = sorted(self.free)[:count]
        self.free.difference_update(chosen)
        return chosen

    def _evict(self, num_tokens: int) -> None:
        locked = self._locked_prefixes()
        evictable = len(self.cached) - len(locked)
        freed = slot_list(self.cache.evict(num_tokens))
        assert len(set(freed)) == len(freed), "evict returned a slot twice"
        locked_slots = {self.cached[p] for p in locked}
        for slot in freed:
            assert slot in self.position_of, f"evict returned slot {slot}, which the cache did not hold"
            assert slot not in locked_slots, f"evict freed slot {slot} of a running request's locked prefix"
        assert len(freed) >= min(num_tokens, evictable), (
            f"evict({num_tokens}) freed {len(freed)} tokens with {evictable} evictable"
        )
        for slot in freed:
            del self.cached[self.position_of.pop(slot)]
        self.free.update(freed)

    def _finish(self, request: _Request) -> None:
        aligned = len(request.tokens) - len(request.tokens) % self.page_size
        offered = request.slots[:aligned]
        returned = slot_list(self.cache.insert_prefix(request.tokens[:aligned], slot_tensor(offered)))
        assert len(set(returned)) == len(returned), "insert returned a slot twice"
        assert set(returned) <= set(offered[request.matched :]), (
            "insert returned a slot the caller did not own (its matched prefix or someone else's)"
        )
        returned_set = set(returned)
        for i in range(request.matched, aligned):
            if offered[i] in returned_set:
                continue
            position = self._position(request.tokens, i)
            assert position not in self.cached, (
                f"insert kept slot {offered[i]} for a position it already held"
            )
            self.cached[position] = offered[i]
            self.position_of[offered[i]] = position
        self.free.update(returned)
        self.free.update(request.slots[aligned:])
        self.cache.unlock(request.handle)


class CacheManagerSuite:
    """Tests every cache manager passes. Subclass it as ``Test...`` and set ``cache_cls``."""

    #: the cache manager: its class, "package.module:Class", or a name an installed plugin registers
    cache_cls: ClassVar[type[CacheManager] | str]
    page_sizes: ClassVar[tuple[int, ...]] = (1, 4)
    #: slots in the randomized model's pool: small, so eviction under pressure happens often
    num_slots: ClassVar[int] = 32
    hypothesis_settings: ClassVar[settings] = settings(
        max_examples=150,
        stateful_step_count=40,
        deadline=None,
        database=None,  # keep the checkout clean; a failure prints its steps
        suppress_health_check=[HealthCheck.too_slow],
    )

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "page_size" in metafunc.fixturenames:
            metafunc.parametrize("page_size", self.page_sizes, ids=[f"page{p}" for p in self.page_sizes])

    @classmethod
    def cache_class(cls) -> type[CacheManager]:
        if getattr(cls, "cache_cls", None) is None:
            raise TypeError(f"{cls.__name__} must set cache_cls")
        return resolve("caches", cls.cache_cls)

    def make_cache(self, page_size: int) -> CacheManager:
        return build(self.cache_class(), page_size=page_size)

    def require(self, capability: str) -> None:
        if capability not in self.cache_class().capabilities:
            pytest.skip(f"{self.cache_class().__name__} does not declare {capability!r}")

    def test_random_usage(self, page_size: int) -> None:
        model = type(
            f"{self.cache_class().__name__}UsageModel",
            (CacheUsageModel,),
            {
                "make_cache": staticmethod(lambda: self.make_cache(page_size)),
                "page_size": page_size,
                "prefix_reuse": PREFIX_REUSE in self.cache_class().capabilities,
                "num_slots": self.num_slots,
            },
        )
        run_state_machine_as_test(model, settings=self.hypothesis_settings)

    # ---- examples every cache passes -----------------------------------------------------------

    def test_empty_cache_matches_nothing(self, page_size: int) -> None:
        cache = self.make_cache(page_size)
        match = cache.match_prefix(list(range(3 * page_size)))
        assert slot_list(match.slots) == []
        cache.lock(match.handle)  # a handle is meaningful even when nothing matched
        assert tuple(cache.size_info()) == (0, 0)
        cache.unlock(match.handle)
        cache.check_integrity()

    def test_insert_keeps_or_returns_each_slot(self, page_size: int) -> None:
        cache = self.make_cache(page_size)
        offered = list(range(10, 10 + 3 * page_size))
        returned = slot_list(cache.insert_prefix(list(range(3 * page_size)), slot_tensor(offered)))
        assert len(set(returned)) == len(returned) and set(returned) <= set(offered)
        kept = set(offered) - set(returned)
        assert tuple(cache.size_info()) == (len(kept), 0)
        assert set(slot_list(cache.evict(len(offered)))) == kept  # evicting everything gives the rest back
        assert tuple(cache.size_info()) == (0, 0)
        cache.check_integrity()

    # ---- examples for caches that reuse prefixes -----------------------------------------------

    def test_identical_prompt_matches_whole_pages(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        prompt = [7, 3, 5] * (page_size + 1) + [1]  # a page-unaligned prompt when page_size > 1
        aligned = len(prompt) - len(prompt) % page_size
        slots = list(range(100, 100 + aligned))
        assert slot_list(cache.insert_prefix(prompt[:aligned], slot_tensor(slots))) == []
        assert slot_list(cache.match_prefix(prompt).slots) == slots
        partial = 2 * page_size + 1  # two pages and a token: the token is not matched when page_size > 1
        assert slot_list(cache.match_prefix(prompt[:partial]).slots) == slots[: partial - partial % page_size]
        assert tuple(cache.size_info()) == (aligned, 0)
        cache.check_integrity()

    def test_a_salted_key_matches_only_itself(self, page_size: int) -> None:
        """Under a cache salt the core's key starts with a negative integer (API 2.5,
        ``Request.cache_key``): a cache takes it as any other key, and the same tokens under
        another first key, or none, match nothing of it."""
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        tokens = [5, 6, 7] * page_size
        salted = [-(2**61) - 12345, *tokens[1:]]
        slots = list(range(50, 50 + len(tokens)))
        assert slot_list(cache.insert_prefix(salted, slot_tensor(slots))) == []
        assert slot_list(cache.match_prefix(salted).slots) == slots
        assert slot_list(cache.match_prefix(tokens).slots) == []
        assert slot_list(cache.match_prefix([-(2**61) - 1, *tokens[1:]]).slots) == []
        cache.check_integrity()

    def test_split_in_the_middle_of_an_entry(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        first = [1] * (3 * page_size)
        first_slots = list(range(3 * page_size))
        cache.insert_prefix(first, slot_tensor(first_slots))
        # shares one page and one more token, so the match ends inside the entry, rounded to a page
        second = first[: page_size + 1] + [2] * (2 * page_size - 1)
        shared = (page_size + 1) - (page_size + 1) % page_size
        match = cache.match_prefix(second)
        assert slot_list(match.slots) == first_slots[:shared]
        cache.lock(match.handle)
        own = list(range(100, 100 + len(second) - shared))
        assert slot_list(cache.insert_prefix(second, slot_tensor(first_slots[:shared] + own))) == []
        cache.unlock(match.handle)
        assert slot_list(cache.match_prefix(first).slots) == first_slots
        assert slot_list(cache.match_prefix(second).slots) == first_slots[:shared] + own
        assert tuple(cache.size_info()) == (len(first) + len(own), 0)
        cache.check_integrity()

    def test_insert_returns_slots_of_positions_already_cached(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        prompt = [4, 2] * (2 * page_size)
        old, new = list(range(len(prompt))), list(range(50, 50 + len(prompt)))
        cache.insert_prefix(prompt, slot_tensor(old))
        assert sorted(slot_list(cache.insert_prefix(prompt, slot_tensor(new)))) == new
        assert slot_list(cache.match_prefix(prompt).slots) == old
        assert tuple(cache.size_info()) == (len(prompt), 0)

    def test_eviction_is_least_recently_used_first(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        length = 2 * page_size
        prompts = {name: [first] * length for name, first in (("a", 1), ("b", 2), ("c", 3))}
        slots = {name: list(range(i * length, (i + 1) * length)) for i, name in enumerate(prompts)}
        for name in "abc":
            cache.insert_prefix(prompts[name], slot_tensor(slots[name]))
        cache.match_prefix(prompts["a"])  # a is now the most recently used
        for name in "bca":
            assert sorted(slot_list(cache.evict(length))) == slots[name]
        assert tuple(cache.size_info()) == (0, 0)

    def test_lock_protects_the_matched_prefix(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        locked_prompt = [1] * (2 * page_size)
        other = [1] * page_size + [2] * page_size  # shares the first page
        cache.insert_prefix(locked_prompt, slot_tensor(range(2 * page_size)))
        cache.insert_prefix(other, slot_tensor([*range(page_size), *range(100, 100 + page_size)]))
        match = cache.match_prefix(locked_prompt)
        cache.lock(match.handle)
        assert tuple(cache.size_info()) == (page_size, 2 * page_size)
        assert sorted(slot_list(cache.evict(100))) == list(range(100, 100 + page_size))
        assert slot_list(cache.match_prefix(locked_prompt).slots) == list(range(2 * page_size))
        cache.unlock(match.handle)
        assert tuple(cache.size_info()) == (2 * page_size, 0)
        assert sorted(slot_list(cache.evict(100))) == list(range(2 * page_size))
        cache.check_integrity()

    def test_a_match_stays_lockable_after_other_matches(self, page_size: int) -> None:
        """The core matches a request when the policy asks and locks that match at admission,
        possibly after matching others (which may split the entry the first match ends in)."""
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        prompt = [5] * (3 * page_size)
        cache.insert_prefix(prompt, slot_tensor(range(len(prompt))))
        whole = cache.match_prefix(prompt)
        shorter = cache.match_prefix(prompt[:page_size] + [6] * page_size)  # ends inside the entry
        cache.lock(whole.handle)
        cache.lock(shorter.handle)
        assert slot_list(whole.slots) == list(range(len(prompt)))
        assert slot_list(shorter.slots) == list(range(page_size))
        assert tuple(cache.size_info()) == (0, len(prompt))
        cache.unlock(whole.handle)
        assert tuple(cache.size_info()) == (2 * page_size, page_size)
        cache.unlock(shorter.handle)
        assert tuple(cache.size_info()) == (len(prompt), 0)
        cache.check_integrity()

    def test_lock_is_reference_counted(self, page_size: int) -> None:
        self.require(PREFIX_REUSE)
        cache = self.make_cache(page_size)
        prompt = [3] * (2 * page_size)
        cache.insert_prefix(prompt, slot_tensor(range(len(prompt))))
        first, second = cache.match_prefix(prompt), cache.match_prefix(prompt)
        cache.lock(first.handle)
        cache.lock(second.handle)
        cache.unlock(first.handle)
        assert tuple(cache.size_info()) == (0, len(prompt))
        assert slot_list(cache.evict(100)) == []
        cache.unlock(second.handle)
        assert tuple(cache.size_info()) == (len(prompt), 0)
        cache.check_integrity()

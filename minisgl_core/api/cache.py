"""Prefix-cache managers: which KV slots of earlier requests can be reused by new ones.

Slot ownership: the core's allocator owns free slots. A slot passed to :meth:`CacheManager.insert_prefix`
becomes the cache's, unless insert returns it; it goes back to the allocator only when
:meth:`CacheManager.evict` returns it. A request that matched a prefix holds its handle locked
until it finishes, so those slots are never evicted under it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, NamedTuple

import torch


class PrefixMatch(NamedTuple):
    #: opaque; pass it to lock/unlock. Meaningful even when nothing matched.
    handle: Any
    #: [matched_len] int64 KV slots of the matched tokens (CPU); matched_len is a multiple of page_size
    slots: torch.Tensor


class CacheSize(NamedTuple):
    #: tokens held by the cache that evict() could free now
    evictable: int
    #: tokens held by the cache but locked by running requests
    protected: int


class CacheManager(ABC):
    capabilities: ClassVar[frozenset[str]] = frozenset({"prefix_reuse"})

    def __init__(self, *, page_size: int) -> None:
        self.page_size = page_size

    @abstractmethod
    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        """Longest cached prefix of ``tokens``, rounded down to whole pages. Does not lock.

        ``tokens`` here and in :meth:`insert_prefix` are a key: a request's token ids, except
        that under a cache salt (vLLM's ``cache_salt``, API 2.5) the first is a negative integer
        standing for the salt and that token, so requests of different salts share no entry.
        Compare them as integers; do not read them as token ids.

        The core may lock the handle after other ``match_prefix`` and ``lock`` calls (the policy's
        question and the admission share one match), but never after an ``insert_prefix`` or
        ``evict`` in between: it matches again then."""

    @abstractmethod
    def lock(self, handle: Any) -> None:
        """Protect the matched slots from eviction (reference-counted)."""

    @abstractmethod
    def unlock(self, handle: Any) -> None:
        """Undo one :meth:`lock`."""

    @abstractmethod
    def insert_prefix(self, tokens: list[int], slots: torch.Tensor) -> torch.Tensor:
        """Offer ``slots`` (one per token, ``len(tokens)`` a multiple of page_size) to the cache.

        Returns (1-D int64, CPU) the offered slots the cache did not keep (for example positions it already
        had under other slots); the caller frees those. Every other slot now belongs to the cache.
        A slot the cache already holds for that position (the caller's own matched prefix) is
        neither kept twice nor returned."""

    @abstractmethod
    def evict(self, num_tokens: int) -> torch.Tensor:
        """Free at least ``num_tokens`` unlocked tokens if possible (least recently used first);
        return the freed slots (1-D int64, CPU; possibly fewer when not enough is evictable)."""

    @abstractmethod
    def size_info(self) -> CacheSize: ...

    def check_integrity(self) -> None:
        """Raise AssertionError when internal invariants are broken (used by tests)."""

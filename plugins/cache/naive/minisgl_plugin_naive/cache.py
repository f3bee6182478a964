"""A cache manager that caches nothing: no prefix reuse, so every finished request's slots go back.

It exists as a baseline (measure what prefix caching buys) and to run the core with the cache
out of the picture when debugging.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from minisgl_core.api import CacheManager, CacheSize, PrefixMatch


class NaiveCache(CacheManager):
    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, *, page_size: int) -> None:
        super().__init__(page_size=page_size)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        return PrefixMatch(handle=None, slots=torch.empty(0, dtype=torch.int64))

    def lock(self, handle: Any) -> None:
        pass  # nothing is cached, so there is nothing to protect

    def unlock(self, handle: Any) -> None:
        pass

    def insert_prefix(self, tokens: list[int], slots: torch.Tensor) -> torch.Tensor:
        if len(tokens) % self.page_size:
            raise ValueError(
                f"insert_prefix needs whole pages: {len(tokens)} tokens, page_size {self.page_size}"
            )
        if slots.shape != (len(tokens),):
            raise ValueError(
                f"insert_prefix needs one slot per token: {tuple(slots.shape)} for {len(tokens)}"
            )
        # Keeps nothing: every offered slot goes back to the caller.
        return slots.to(device="cpu", dtype=torch.int64).clone()

    def evict(self, num_tokens: int) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)

    def size_info(self) -> CacheSize:
        return CacheSize(evictable=0, protected=0)

    def check_integrity(self) -> None:
        pass  # no state

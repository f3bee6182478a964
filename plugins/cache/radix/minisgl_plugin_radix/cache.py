"""Radix-tree prefix cache: KV slots of earlier requests, keyed by their token ids in whole pages.

Each node holds a run of tokens (a multiple of ``page_size`` long) and the KV slots of those tokens;
children are keyed by their first page, so a lookup compares whole pages and a match always ends
on a page boundary. Matching or inserting inside a node splits it there, so a match handle is
exactly the node where the match ends and locking it protects exactly the matched tokens.
Eviction removes least-recently-used unlocked leaves; "recent" is a logical clock, not wall time,
so the order is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

import torch

from minisgl_core.api import CacheManager, CacheSize, PrefixMatch


def _empty_slots() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)


class _Node:
    __slots__ = ("key", "slots", "children", "parent", "lock_ref", "last_access", "uid")

    def __init__(self, key: list[int], slots: torch.Tensor, parent: _Node | None, uid: int, now: int) -> None:
        self.key = key
        self.slots = slots
        self.children: dict[tuple[int, ...], _Node] = {}
        self.parent = parent
        self.lock_ref = 0
        self.last_access = now
        self.uid = uid  # breaks last_access ties in the eviction heap, in creation order


class RadixCache(CacheManager):
    def __init__(self, *, page_size: int) -> None:
        super().__init__(page_size=page_size)
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self._clock = 0
        self._next_uid = 0
        self._root = self._new_node([], _empty_slots(), None)
        self._evictable = 0
        self._protected = 0

    # ---- the CacheManager API ------------------------------------------------------------------

    def match_prefix(self, tokens: list[int]) -> PrefixMatch:
        page = self.page_size
        usable = len(tokens) - len(tokens) % page
        now = self._tick()
        node, pos, parts = self._root, 0, []
        while pos < usable:
            child = node.children.get(tuple(tokens[pos : pos + page]))
            if child is None:
                break
            matched = self._common_length(child.key, tokens, pos, usable)
            if matched < len(child.key):
                child = self._split(child, matched)
            child.last_access = now
            parts.append(child.slots)
            node, pos = child, pos + matched
        slots = torch.cat(parts) if parts else _empty_slots()
        return PrefixMatch(handle=node, slots=slots)

    def lock(self, handle: Any) -> None:
        node = self._checked_handle(handle)
        while node is not self._root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: Any) -> None:
        node = self._checked_handle(handle)
        while node is not self._root:
            if node.lock_ref <= 0:
                raise ValueError("RadixCache.unlock() without a matching lock()")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node = node.parent

    def insert_prefix(self, tokens: list[int], slots: torch.Tensor) -> torch.Tensor:
        page = self.page_size
        if len(tokens) % page:
            raise ValueError(f"insert_prefix needs whole pages: {len(tokens)} tokens, page_size {page}")
        if slots.shape != (len(tokens),):
            raise ValueError(
                f"insert_prefix needs one slot per token: {tuple(slots.shape)} for {len(tokens)}"
            )
        slots = slots.to(device="cpu", dtype=torch.int64)
        now = self._tick()
        node, pos, rejected = self._root, 0, []
        while pos < len(tokens):
            child = node.children.get(tuple(tokens[pos : pos + page]))
            if child is None:
                # The cache keeps its own copy: the caller's tensor is often a view of a table it reuses.
                leaf = self._new_node(list(tokens[pos:]), slots[pos:].clone(), node)
                node.children[tuple(tokens[pos : pos + page])] = leaf
                self._evictable += len(leaf.key)
                break
            matched = self._common_length(child.key, tokens, pos, len(tokens))
            if matched < len(child.key):
                child = self._split(child, matched)
            # Positions the tree already has: keep the tree's slot; hand back the offered one unless
            # it is that very slot (the caller's own matched prefix).
            offered = slots[pos : pos + matched]
            duplicate = offered != child.slots
            if bool(duplicate.any()):
                rejected.append(offered[duplicate])
            child.last_access = now
            node, pos = child, pos + matched
        return torch.cat(rejected) if rejected else _empty_slots()

    def evict(self, num_tokens: int) -> torch.Tensor:
        if num_tokens <= 0:
            return _empty_slots()
        heap = [(n.last_access, n.uid, n) for n in self._nodes() if self._is_evictable_leaf(n)]
        heapq.heapify(heap)
        freed: list[torch.Tensor] = []
        num_freed = 0
        while num_freed < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[tuple(node.key[: self.page_size])]
            node.parent = None  # marks the node detached, so a stale handle is caught
            freed.append(node.slots)
            num_freed += len(node.key)
            self._evictable -= len(node.key)
            if self._is_evictable_leaf(parent):
                heapq.heappush(heap, (parent.last_access, parent.uid, parent))
        return torch.cat(freed) if freed else _empty_slots()

    def size_info(self) -> CacheSize:
        return CacheSize(evictable=self._evictable, protected=self._protected)

    def check_integrity(self) -> None:
        evictable = protected = 0
        seen: set[int] = set()
        for node in self._nodes():
            if node is self._root:
                assert not node.key and node.lock_ref >= 0, "root must stay empty"
                continue
            assert node.key and len(node.key) % self.page_size == 0, f"key length {len(node.key)}"
            assert node.slots.dtype == torch.int64 and node.slots.shape == (len(node.key),)
            assert node.lock_ref >= 0, f"negative lock_ref {node.lock_ref}"
            parent = node.parent
            assert parent is not None and parent.children.get(tuple(node.key[: self.page_size])) is node
            if parent is not self._root:
                assert parent.lock_ref >= node.lock_ref, "a locked node's ancestors must be locked"
            slot_list = node.slots.tolist()
            assert seen.isdisjoint(slot_list) and len(set(slot_list)) == len(slot_list), "slot held twice"
            seen.update(slot_list)
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self._evictable, self._protected), (
            f"counts drifted: tree has evictable={evictable} protected={protected}, "
            f"kept {self._evictable}/{self._protected}"
        )

    # ---- tree helpers --------------------------------------------------------------------------

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _new_node(self, key: list[int], slots: torch.Tensor, parent: _Node | None) -> _Node:
        self._next_uid += 1
        return _Node(key, slots, parent, self._next_uid, self._clock)

    def _common_length(self, key: list[int], tokens: list[int], pos: int, end: int) -> int:
        """Tokens of ``key`` equal to ``tokens[pos:end]``, rounded down to whole pages."""
        limit = min(len(key), end - pos)
        if key[:limit] == tokens[pos : pos + limit]:  # the common case, compared in C
            return limit
        i = self.page_size  # the first page is equal: that is how the child was found
        while key[i] == tokens[pos + i]:
            i += 1
        return i - i % self.page_size

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after ``at`` tokens; the new node takes the head and becomes its parent,
        so handles to ``node`` still end where they did and the lock counts carry over."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.key)
        head = self._new_node(node.key[:at], node.slots[:at], parent)
        head.lock_ref = node.lock_ref
        head.last_access = node.last_access
        parent.children[tuple(node.key[: self.page_size])] = head
        node.key, node.slots, node.parent = node.key[at:], node.slots[at:], head
        head.children[tuple(node.key[: self.page_size])] = node
        return head

    def _is_evictable_leaf(self, node: _Node) -> bool:
        return node is not self._root and not node.children and node.lock_ref == 0

    def _checked_handle(self, handle: Any) -> _Node:
        if not isinstance(handle, _Node):
            raise TypeError(f"not a RadixCache handle: {handle!r}")
        if handle is not self._root and handle.parent is None:
            raise ValueError("stale RadixCache handle: its entry was evicted (lock right after match)")
        return handle

    def _nodes(self) -> Iterator[_Node]:
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

"""RadixCache: the shared cache suite plus the tree-specific behaviours (splits, stale handles,
integrity checking, registration)."""

from __future__ import annotations

import importlib

import minisgl_plugin_radix
import pytest
import torch
from minisgl_plugin_radix.cache import RadixCache

from minisgl_core.testing.cache_suite import CacheManagerSuite, slot_list, slot_tensor


class TestRadixCache(CacheManagerSuite):
    cache_cls = RadixCache


def test_plugin_registers_the_cache_lazily() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_radix.minisgl_register_caches(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("radix", "minisgl_plugin_radix.cache:RadixCache")]
    module, attribute = registered[0][1].split(":")
    assert getattr(importlib.import_module(module), attribute) is RadixCache
    assert minisgl_plugin_radix.MINISGL_API == "2.0"


def test_insert_needs_whole_pages_and_one_slot_per_token() -> None:
    cache = RadixCache(page_size=4)
    with pytest.raises(ValueError, match="whole pages"):
        cache.insert_prefix([1, 2, 3, 4, 5], slot_tensor(range(5)))
    with pytest.raises(ValueError, match="one slot per token"):
        cache.insert_prefix([1, 2, 3, 4], slot_tensor(range(3)))
    assert tuple(cache.size_info()) == (0, 0)


def test_cache_keeps_its_own_copy_of_the_slots() -> None:
    cache = RadixCache(page_size=2)
    table_row = slot_tensor(range(20, 26))  # the core passes views of a table it reuses
    cache.insert_prefix([1, 2, 3, 4, 5, 6], table_row)
    table_row.fill_(-1)
    assert slot_list(cache.match_prefix([1, 2, 3, 4, 5, 6]).slots) == list(range(20, 26))


def test_split_of_a_locked_entry_keeps_it_locked() -> None:
    cache = RadixCache(page_size=2)
    cache.insert_prefix([1, 1, 2, 2, 3, 3], slot_tensor(range(6)))
    match = cache.match_prefix([1, 1, 2, 2, 3, 3])
    cache.lock(match.handle)
    # splits the locked entry after its first page
    assert slot_list(cache.insert_prefix([1, 1, 9, 9], slot_tensor([0, 1, 10, 11]))) == []
    assert tuple(cache.size_info()) == (2, 6)
    cache.check_integrity()
    assert sorted(slot_list(cache.evict(100))) == [10, 11]
    cache.unlock(match.handle)
    assert tuple(cache.size_info()) == (6, 0)
    cache.check_integrity()


def test_match_refreshes_the_shared_path_for_lru() -> None:
    cache = RadixCache(page_size=1)
    cache.insert_prefix([5, 6, 7], slot_tensor([0, 1, 2]))
    cache.insert_prefix([5, 6, 8], slot_tensor([0, 1, 3]))
    cache.match_prefix([5, 6, 7, 4])  # [5, 6, 7] is now more recent than [5, 6, 8]
    assert slot_list(cache.evict(1)) == [3]
    assert slot_list(cache.evict(1)) == [2]
    # the shared parent became a leaf: it goes next
    assert sorted(slot_list(cache.evict(1))) == [0, 1]


def test_one_evict_call_frees_parents_whose_children_it_freed() -> None:
    cache = RadixCache(page_size=1)
    cache.insert_prefix([1, 2, 3], slot_tensor([0, 1, 2]))
    cache.insert_prefix([1, 2, 4], slot_tensor([0, 1, 3]))
    assert sorted(slot_list(cache.evict(4))) == [0, 1, 2, 3]
    assert tuple(cache.size_info()) == (0, 0)
    cache.check_integrity()


def test_stale_handle_and_unbalanced_unlock_are_errors() -> None:
    cache = RadixCache(page_size=1)
    cache.insert_prefix([1, 2], slot_tensor([0, 1]))
    match = cache.match_prefix([1, 2])
    with pytest.raises(ValueError, match="without a matching lock"):
        cache.unlock(match.handle)
    cache.evict(2)
    with pytest.raises(ValueError, match="stale"):
        cache.lock(match.handle)
    with pytest.raises(TypeError):
        cache.lock(object())


def test_check_integrity_catches_a_slot_held_twice_and_drifted_counts() -> None:
    cache = RadixCache(page_size=1)
    cache.insert_prefix([1, 2], slot_tensor([0, 1]))
    cache.insert_prefix([3], slot_tensor([5]))
    cache.check_integrity()
    leaf = cache.match_prefix([3]).handle
    leaf.slots = slot_tensor([0])
    with pytest.raises(AssertionError, match="slot held twice"):
        cache.check_integrity()
    leaf.slots = slot_tensor([5])
    cache._evictable += 1
    with pytest.raises(AssertionError, match="counts drifted"):
        cache.check_integrity()


def test_long_prompt_matches_in_one_node() -> None:
    cache = RadixCache(page_size=16)
    prompt = torch.randint(0, 50_000, (8192,), generator=torch.Generator().manual_seed(0)).tolist()
    cache.insert_prefix(prompt, torch.arange(8192))
    match = cache.match_prefix(prompt + [1, 2, 3])
    assert torch.equal(match.slots, torch.arange(8192))
    assert match.handle.parent is cache._root  # one node, no per-page splitting
    diverged = prompt[:1000] + [-1] * 100  # diverges inside page 62: the match stops at page 62
    assert slot_list(cache.match_prefix(diverged).slots) == list(range(992))
    cache.check_integrity()

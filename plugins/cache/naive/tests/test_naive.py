"""NaiveCache: the shared cache suite (its prefix-reuse tests are skipped) plus what "no reuse" means."""

from __future__ import annotations

import importlib

import minisgl_plugin_naive
from minisgl_plugin_naive.cache import NaiveCache

from minisgl_core.testing.cache_suite import CacheManagerSuite, slot_list, slot_tensor


class TestNaiveCache(CacheManagerSuite):
    cache_cls = NaiveCache


def test_plugin_registers_the_cache_lazily() -> None:
    registered: list[tuple[str, str]] = []
    minisgl_plugin_naive.minisgl_register_caches(
        register=lambda name, target: registered.append((name, target))
    )
    assert registered == [("naive", "minisgl_plugin_naive.cache:NaiveCache")]
    module, attribute = registered[0][1].split(":")
    assert getattr(importlib.import_module(module), attribute) is NaiveCache
    assert minisgl_plugin_naive.MINISGL_API == "2.0"


def test_declares_no_prefix_reuse() -> None:
    assert "prefix_reuse" not in NaiveCache.capabilities


def test_nothing_is_ever_reused() -> None:
    cache = NaiveCache(page_size=2)
    prompt = [1, 2, 3, 4]
    offered = slot_tensor([7, 8, 9, 10])
    returned = cache.insert_prefix(prompt, offered)
    assert slot_list(returned) == [7, 8, 9, 10]
    assert returned.data_ptr() != offered.data_ptr()  # the caller may reuse its tensor
    assert slot_list(cache.match_prefix(prompt).slots) == []
    assert slot_list(cache.evict(10)) == []
    assert tuple(cache.size_info()) == (0, 0)

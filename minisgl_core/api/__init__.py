"""minisgl's stable extension API: the only module plugins import.

Versioned by :data:`API_VERSION` ("major.minor"). A plugin declares ``MINISGL_API = "1.0"``, the
oldest version it needs; it is compatible when the majors are equal and its minor is not newer
than the core's. Every name in ``__all__`` is covered by a snapshot test.

The names are imported on first use (PEP 562): plugin discovery needs only ``hookimpl`` and
``API_VERSION``, so the processes that never touch a tensor (tokenizer, detokenizer, API server)
load every plugin without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from minisgl_core.api.hookspecs import hookimpl, hookspec

API_VERSION = "1.5"

__all__ = [
    "API_VERSION",
    "AttentionBackend",
    "AttentionConfig",
    "Budgets",
    "CacheManager",
    "CacheSize",
    "DecodePlan",
    "ForwardBatch",
    "KVCache",
    "KVSpec",
    "MinisglDeprecationWarning",
    "Model",
    "ModelConfig",
    "PageRanges",
    "PagedLayout",
    "ParallelContext",
    "PrefillPlan",
    "PrefixMatch",
    "ProcessContext",
    "RequestView",
    "SchedulerState",
    "SchedulingPolicy",
    "SharedPrefix",
    "deprecated",
    "hookimpl",
    "hookspec",
    "paged_layout",
    "paged_ranges",
    "renamed",
    "renamed_attribute",
    "warn_deprecated",
]


# name -> the submodule that defines it
_LAZY: dict[str, str] = {
    "AttentionBackend": "attention",
    "AttentionConfig": "attention",
    "KVCache": "attention",
    "PagedLayout": "attention",
    "PageRanges": "attention",
    "paged_layout": "attention",
    "paged_ranges": "attention",
    "ForwardBatch": "batch",
    "SharedPrefix": "batch",
    "CacheManager": "cache",
    "CacheSize": "cache",
    "PrefixMatch": "cache",
    "MinisglDeprecationWarning": "deprecation",
    "deprecated": "deprecation",
    "renamed": "deprecation",
    "renamed_attribute": "deprecation",
    "warn_deprecated": "deprecation",
    "KVSpec": "model",
    "Model": "model",
    "ModelConfig": "model",
    "ParallelContext": "parallel",
    "Budgets": "policy",
    "DecodePlan": "policy",
    "PrefillPlan": "policy",
    "RequestView": "policy",
    "SchedulerState": "policy",
    "SchedulingPolicy": "policy",
    "ProcessContext": "process",
}

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from minisgl_core.api.attention import (
        AttentionBackend,
        AttentionConfig,
        KVCache,
        PagedLayout,
        PageRanges,
        paged_layout,
        paged_ranges,
    )
    from minisgl_core.api.batch import ForwardBatch, SharedPrefix
    from minisgl_core.api.cache import CacheManager, CacheSize, PrefixMatch
    from minisgl_core.api.deprecation import (
        MinisglDeprecationWarning,
        deprecated,
        renamed,
        renamed_attribute,
        warn_deprecated,
    )
    from minisgl_core.api.model import KVSpec, Model, ModelConfig
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.api.policy import (
        Budgets,
        DecodePlan,
        PrefillPlan,
        RequestView,
        SchedulerState,
        SchedulingPolicy,
    )
    from minisgl_core.api.process import ProcessContext


def __getattr__(name: str) -> Any:
    submodule = _LAZY.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

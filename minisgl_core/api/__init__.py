"""minisgl's stable extension API: the only module plugins import.

Versioned by :data:`API_VERSION` ("major.minor"). A plugin declares ``MINISGL_API = "2.0"``, the
oldest version it needs; it is compatible when the majors are equal and its minor is not newer
than the core's (API 2.0 also loaded 1.x plugins, with a deprecation warning; 2.1 and later
refuse them). Every name in ``__all__`` is covered by a snapshot test.

The API is types, hookspecs and versions. The model layers and kernels plugins build models from
live in :mod:`minisgl_core.layers`: usable, but not promised (their changes are no API change).

The names are imported on first use (PEP 562): plugin discovery needs only ``hookimpl`` and
``API_VERSION``, so the processes that never touch a tensor (tokenizer, detokenizer, API server)
load every plugin without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from minisgl_core.api.hookspecs import hookimpl, hookspec

API_VERSION = "2.9"

__all__ = [
    "API_VERSION",
    "AttentionBackend",
    "AttentionConfig",
    "Budgets",
    "CacheManager",
    "CacheSize",
    "DecodePlan",
    "ForwardBatch",
    "GrammarBackend",
    "GrammarError",
    "GrammarKind",
    "GrammarMatcher",
    "GrammarSpec",
    "HostPagedLayout",
    "JsonToolCallParser",
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
    "QuantizationMethod",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningResult",
    "RequestView",
    "ScanMemo",
    "ScannedCall",
    "SchedulerState",
    "SchedulingPolicy",
    "SharedPrefix",
    "StreamingToolParser",
    "WeightFormat",
    "TagReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParseResult",
    "ToolParser",
    "ToolStreamDelta",
    "allocate_token_bitmask",
    "allowed_tokens",
    "bitmask_width",
    "default_fill_threads",
    "deprecated",
    "hookimpl",
    "hookspec",
    "layer_count_problem",
    "marker_prefix_length",
    "merge_tool_deltas",
    "new_tool_call_id",
    "paged_layout",
    "paged_ranges",
    "plan_prefill",
    "renamed",
    "renamed_attribute",
    "scan_tool_call",
    "warn_deprecated",
]


# name -> the submodule that defines it
_LAZY: dict[str, str] = {
    "AttentionBackend": "attention",
    "AttentionConfig": "attention",
    "KVCache": "attention",
    "PageRanges": "attention",
    "paged_ranges": "attention",
    "ForwardBatch": "batch",
    "HostPagedLayout": "batch",
    "PagedLayout": "batch",
    "paged_layout": "batch",
    "SharedPrefix": "batch",
    "CacheManager": "cache",
    "CacheSize": "cache",
    "PrefixMatch": "cache",
    "MinisglDeprecationWarning": "deprecation",
    "deprecated": "deprecation",
    "renamed": "deprecation",
    "renamed_attribute": "deprecation",
    "warn_deprecated": "deprecation",
    "GrammarBackend": "grammar",
    "GrammarError": "grammar",
    "GrammarKind": "grammar",
    "GrammarMatcher": "grammar",
    "GrammarSpec": "grammar",
    "allocate_token_bitmask": "grammar",
    "allowed_tokens": "grammar",
    "bitmask_width": "grammar",
    "default_fill_threads": "grammar",
    "ScannedCall": "json_scan",
    "marker_prefix_length": "json_scan",
    "scan_tool_call": "json_scan",
    "ScanMemo": "json_scan",
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
    "plan_prefill": "policy",
    "ProcessContext": "process",
    "QuantizationMethod": "quantization",
    "ReasoningDelta": "reasoning",
    "ReasoningParser": "reasoning",
    "ReasoningResult": "reasoning",
    "TagReasoningParser": "reasoning",
    "JsonToolCallParser": "tool_parser",
    "ToolCall": "tool_parser",
    "ToolCallDelta": "tool_parser",
    "ToolParser": "tool_parser",
    "ToolParseResult": "tool_parser",
    "ToolStreamDelta": "tool_parser",
    "StreamingToolParser": "tool_parser",
    "merge_tool_deltas": "tool_parser",
    "new_tool_call_id": "tool_parser",
    "WeightFormat": "weights",
    "layer_count_problem": "weights",
}

if TYPE_CHECKING:  # the same names, for type checkers and IDEs
    from minisgl_core.api.attention import (
        AttentionBackend,
        AttentionConfig,
        KVCache,
        PageRanges,
        paged_ranges,
    )
    from minisgl_core.api.batch import ForwardBatch, HostPagedLayout, PagedLayout, SharedPrefix, paged_layout
    from minisgl_core.api.cache import CacheManager, CacheSize, PrefixMatch
    from minisgl_core.api.deprecation import (
        MinisglDeprecationWarning,
        deprecated,
        renamed,
        renamed_attribute,
        warn_deprecated,
    )
    from minisgl_core.api.grammar import (
        GrammarBackend,
        GrammarError,
        GrammarKind,
        GrammarMatcher,
        GrammarSpec,
        allocate_token_bitmask,
        allowed_tokens,
        bitmask_width,
        default_fill_threads,
    )
    from minisgl_core.api.json_scan import ScanMemo, ScannedCall, marker_prefix_length, scan_tool_call
    from minisgl_core.api.model import KVSpec, Model, ModelConfig
    from minisgl_core.api.parallel import ParallelContext
    from minisgl_core.api.policy import (
        Budgets,
        DecodePlan,
        PrefillPlan,
        RequestView,
        SchedulerState,
        SchedulingPolicy,
        plan_prefill,
    )
    from minisgl_core.api.process import ProcessContext
    from minisgl_core.api.quantization import QuantizationMethod
    from minisgl_core.api.reasoning import (
        ReasoningDelta,
        ReasoningParser,
        ReasoningResult,
        TagReasoningParser,
    )
    from minisgl_core.api.tool_parser import (
        JsonToolCallParser,
        StreamingToolParser,
        ToolCall,
        ToolCallDelta,
        ToolParser,
        ToolParseResult,
        ToolStreamDelta,
        merge_tool_deltas,
        new_tool_call_id,
    )
    from minisgl_core.api.weights import WeightFormat, layer_count_problem


def __getattr__(name: str) -> Any:
    submodule = _LAZY.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

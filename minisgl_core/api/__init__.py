"""minisgl's stable extension API: the only module plugins import.

Versioned by :data:`API_VERSION` ("major.minor"). A plugin declares ``MINISGL_API = "1.0"``, the
oldest version it needs; it is compatible when the majors are equal and its minor is not newer
than the core's. Every name in ``__all__`` is covered by a snapshot test.
"""

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
from minisgl_core.api.grammar import (
    GrammarBackend,
    GrammarError,
    GrammarKind,
    GrammarMatcher,
    GrammarSpec,
    allocate_token_bitmask,
    allowed_tokens,
    bitmask_width,
)
from minisgl_core.api.hookspecs import hookimpl, hookspec
from minisgl_core.api.json_scan import ScannedCall, marker_prefix_length, scan_tool_call
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
from minisgl_core.api.reasoning import ReasoningDelta, ReasoningParser, ReasoningResult, TagReasoningParser
from minisgl_core.api.tool_parser import (
    JsonToolCallParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolParseResult,
    ToolStreamDelta,
    merge_tool_deltas,
    new_tool_call_id,
)
from minisgl_core.api.weights import WeightFormat

API_VERSION = "1.6"

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
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningResult",
    "RequestView",
    "ScannedCall",
    "SchedulerState",
    "SchedulingPolicy",
    "SharedPrefix",
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
    "deprecated",
    "hookimpl",
    "hookspec",
    "marker_prefix_length",
    "merge_tool_deltas",
    "new_tool_call_id",
    "paged_layout",
    "paged_ranges",
    "renamed",
    "renamed_attribute",
    "scan_tool_call",
    "warn_deprecated",
]

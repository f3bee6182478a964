"""Constrained decoding in the offline benchmark: the schema every request follows, and how long
the grammar backend takes to get ready for it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from minisgl_core.api import GrammarSpec
from minisgl_core.llm import LLM

#: ``--grammar-schema builtin``
BUILTIN = "builtin"


def unending_schema(max_tokens: int) -> dict[str, Any]:
    """An array of at least ``max_tokens`` bounded objects: every object is longer than one token,
    so no request can finish it (and stop early) before its max_tokens."""
    item = {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "label": {"enum": ["alpha", "beta", "gamma", "delta"]},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
        },
        "required": ["id", "label", "score", "tags"],
        "additionalProperties": False,
    }
    return {"type": "array", "items": item, "minItems": max_tokens}


def schema_spec(source: str, max_tokens: int) -> GrammarSpec:
    """The spec for ``--grammar-schema``: ``builtin`` (:func:`unending_schema`) or a JSON schema file."""
    if source == BUILTIN:
        return GrammarSpec("json_schema", json.dumps(unending_schema(max_tokens)))
    text = Path(source).read_text()
    json.loads(text)  # a clear error for a file that is not JSON
    return GrammarSpec("json_schema", text)


def prepare(llm: LLM, spec: GrammarSpec) -> dict[str, Any]:
    """Build the engine's grammar backend and compile ``spec`` (outside the timed run), timing both."""
    lazy = llm.engine.grammars.backend
    start = time.perf_counter()
    backend = lazy.get()
    built = time.perf_counter()
    backend.compile(spec)
    compiled = time.perf_counter()
    return {
        "grammar_backend": lazy.name,
        "grammar_backend_init_s": round(built - start, 3),
        "grammar_compile_s": round(compiled - built, 3),
        "grammar_schema_chars": len(spec.value),
    }

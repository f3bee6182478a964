"""What a plugin learns about the process it runs in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["api", "tokenizer", "detokenizer", "scheduler", "offline"]


@dataclass(frozen=True)
class ProcessContext:
    role: Role
    tp_rank: int = 0
    tp_size: int = 1
    #: parsed CLI options (including the ones plugins added), as a plain dict
    options: dict[str, Any] = field(default_factory=dict)

"""What a request's output must match: the request-side contract of constrained decoding."""

from dataclasses import dataclass
from typing import Literal

GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "ebnf", "structural_tag"]


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match. value: the JSON schema as JSON text (json_schema),
    "" (json_object), the regex, a JSON list of strings (choice), the EBNF text (ebnf), or the
    structural-tag JSON (structural_tag: free text with tagged regions constrained by schemas)."""

    kind: GrammarKind
    value: str

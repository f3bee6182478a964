"""How a message names an engine setting: as the command line's flag (``--attn``, ``--tp``) or as
the Python API's keyword (``attn=``, ``tp_size=``).

One message serves ``minisgl serve --attn nope`` and ``LLM(attn="nope")``: the code that builds it
takes its caller's :data:`Spelling`, the command line's unless told otherwise. (A ConfigError is
built with the field names and spelt as flags by the command line, ``config_args.cli_message``.)
"""

from __future__ import annotations

from typing import Literal, NamedTuple

#: "flag" for the command line (serve, generate, bench...), "keyword" for the Python API (``LLM``)
Spelling = Literal["flag", "keyword"]

#: settings whose flag is not ``--`` and the field's name with dashes
_FLAGS = {"tp_size": "--tp"}


def flag(field: str) -> str:
    """The command-line flag that sets an :class:`~minisgl_core.config.EngineConfig` field."""
    return _FLAGS.get(field, "--" + field.replace("_", "-"))


def named(field: str, spelling: Spelling = "flag") -> str:
    """The setting alone: ``--page-size`` or ``page_size=``."""
    return flag(field) if spelling == "flag" else f"{field}="


def given(field: str, value: object, spelling: Spelling = "flag", *, quote: bool = False) -> str:
    """The setting with the text the user gave it: ``--model DIR`` (``--attn 'nope'`` with
    ``quote``) or ``model='DIR'``."""
    text = str(value)
    if spelling == "keyword":  # a number as Python writes it (page_size=1), the rest as a string
        return (
            f"{field}={value!r}" if value is None or isinstance(value, (int, float)) else f"{field}={text!r}"
        )
    return f"{flag(field)} {text!r}" if quote else f"{flag(field)} {text}"


class ForeignKeyword(NamedTuple):
    """A vLLM keyword's minisgl setting: the field, the value that means the same (None: the
    user's own), and a note for the keyword's hint."""

    field: str
    value: object = None
    note: str = ""

    def hint(self, spelling: Spelling) -> str:
        """``cuda_graph_max_bs=0 (no CUDA graphs)`` for ``LLM()``, ``--cuda-graph-max-bs 0`` for
        the command line (whose hint gives the flag alone, no note: the note speaks of keywords)."""
        if spelling == "flag":
            return flag(self.field) if self.value is None else f"{flag(self.field)} {self.value}"
        shown = f"{self.field}=" if self.value is None else f"{self.field}={self.value!r}"
        return f"{shown} ({self.note})" if self.note else shown


#: vLLM's ``LLM(...)`` keywords that difflib cannot match to minisgl's setting of the same meaning
#: (``LLM()``'s hints, and the command line's for the same flags)
VLLM_KEYWORDS = {
    "tensor_parallel_size": ForeignKeyword(
        "tp_size", note="LLM runs tp_size 1; `minisgl serve --tp N` runs more"
    ),
    "max_num_seqs": ForeignKeyword("max_running_requests"),
    "max_num_batched_tokens": ForeignKeyword("max_prefill_tokens"),
    "enforce_eager": ForeignKeyword("cuda_graph_max_bs", 0, "no CUDA graphs"),
    "enable_prefix_caching": ForeignKeyword(
        "cache", "radix", "the prefix cache, the default; cache='naive' for none"
    ),
    "scheduling_policy": ForeignKeyword(
        "policy", note="policy='priority' for vLLM's 'priority', the default 'prefill-first' for its 'fcfs'"
    ),
}
#: vLLM's keywords with no minisgl setting, and why none is needed
NOT_NEEDED_KEYWORDS = {
    "trust_remote_code": "minisgl runs no model code from a hub (its architectures are built in or "
    "plugins), so there is nothing to trust: leave it out",
}

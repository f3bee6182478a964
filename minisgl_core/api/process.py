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
    #: the plugins this process loaded, for :meth:`resolve`; the core sets it (a context a test
    #: builds itself has none). Internal: read it through :meth:`resolve`.
    _plugins: Any = field(default=None, repr=False, compare=False)

    def resolve(self, kind: str, name: str) -> type:
        """The class registered under ``name`` as a ``kind`` (``"caches"``, ``"policies"``,
        ``"attention"``, ``"models"``, ``"formats"``, ``"grammars"``, ``"tool_parsers"``,
        ``"reasoning_parsers"``, ``"quantization"``), as the core would build it for that
        selection: ``ctx.resolve("caches", "radix")`` is whatever distribution registers ``radix``,
        checked as a selection is (imports, subclasses the kind's base class).

        Works in every process the core starts (roles ``api``, ``tokenizer``, ``detokenizer``,
        ``scheduler`` and ``offline``), on the context :func:`minisgl_process_start` receives and
        the one a component's constructor takes as ``ctx``: every process loads the same plugins.
        It imports the class's module, so resolve a kind where it runs (a cache or policy in a
        scheduler or offline process: the api, tokenizer and detokenizer processes never import
        torch otherwise).

        Raises LookupError naming the kind, the name and the names registered as that kind when
        none is ``name`` (or the plugin that would provide it and why it did not load); a
        ``minisgl_core.plugins.PluginError`` (a RuntimeError) when the class does not import or two
        distributions register the name; RuntimeError on a context without plugins.

        .. versionadded:: 2.9
        """
        if self._plugins is None:
            raise RuntimeError(
                f"ProcessContext(role={self.role!r}).resolve({kind!r}, {name!r}): this context was "
                "built without the process's plugins; use the one the core passes "
                "(minisgl_process_start's ctx, or a component's ctx argument)"
            )
        return self._plugins.lookup(kind, name)

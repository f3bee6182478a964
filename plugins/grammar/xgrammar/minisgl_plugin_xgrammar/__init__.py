"""minisgl plugin: registers the ``xgrammar`` grammar backend (``--grammar-backend xgrammar``,
the default); xgrammar itself is imported only when the backend is first used."""

from collections.abc import Callable

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_grammar_backends(register: Callable[[str, str], None]) -> None:
    register("xgrammar", "minisgl_plugin_xgrammar.backend:XGrammarBackend")

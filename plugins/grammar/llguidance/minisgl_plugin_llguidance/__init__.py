"""minisgl plugin: registers the ``llguidance`` grammar backend (``--grammar-backend llguidance``);
llguidance itself is imported only when the backend is first used."""

from collections.abc import Callable

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_grammar_backends(register: Callable[[str, str], None]) -> None:
    register("llguidance", "minisgl_plugin_llguidance.backend:LLGuidanceBackend")

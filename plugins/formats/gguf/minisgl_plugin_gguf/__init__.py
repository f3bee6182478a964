"""minisgl plugin: registers the ``gguf`` weight format (``--model path/x.gguf``); the reader loads lazily."""

from collections.abc import Callable

from minisgl_core.api import hookimpl

MINISGL_API = "2.3"


@hookimpl
def minisgl_register_weight_formats(register: Callable[[str, str], None]) -> None:
    register("gguf", "minisgl_plugin_gguf.format:GGUFFormat")

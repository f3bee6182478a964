"""minisgl plugin: registers the ``radix`` cache manager (``--cache radix``); the class loads lazily."""

from collections.abc import Callable

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_caches(register: Callable[[str, str], None]) -> None:
    register("radix", "minisgl_plugin_radix.cache:RadixCache")

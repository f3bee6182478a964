"""minisgl plugin: registers the ``naive`` cache manager (``--cache naive``); the class loads lazily."""

from collections.abc import Callable

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_caches(register: Callable[[str, str], None]) -> None:
    register("naive", "minisgl_plugin_naive.cache:NaiveCache")

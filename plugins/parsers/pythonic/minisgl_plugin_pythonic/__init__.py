"""Entry point of the pythonic tool parser (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.5"


@hookimpl
def minisgl_register_tool_parsers(register):
    register("pythonic", "minisgl_plugin_pythonic.parser:PythonicToolParser")

"""Entry point of the Hermes tool parser (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_tool_parsers(register):
    register("hermes", "minisgl_plugin_hermes.parser:HermesToolParser")

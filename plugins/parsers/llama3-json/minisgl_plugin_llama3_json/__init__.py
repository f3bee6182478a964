"""Entry point of the Llama 3.1 JSON tool parser (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_tool_parsers(register):
    register("llama3_json", "minisgl_plugin_llama3_json.parser:Llama3JsonToolParser")

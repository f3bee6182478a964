"""Entry point of the int4 weight-only quantization methods (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_quantization_methods(register):
    register("int4", "minisgl_plugin_int4.method:Int4Method")
    register("int4-head", "minisgl_plugin_int4.method:Int4HeadMethod")

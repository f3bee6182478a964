"""Entry point of the int8 weight-only quantization method (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

# the quantization hook is new in the next API (1.7 proposed): raise this when the core ships it
MINISGL_API = "1.6"


@hookimpl
def minisgl_register_quantization_methods(register):
    register("int8", "minisgl_plugin_int8.method:Int8Method")

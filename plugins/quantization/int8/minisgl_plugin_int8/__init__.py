"""Entry point of the int8 weight-only quantization method (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.1"  # quantize_experts (API 2.1)


@hookimpl
def minisgl_register_quantization_methods(register):
    register("int8", "minisgl_plugin_int8.method:Int8Method")

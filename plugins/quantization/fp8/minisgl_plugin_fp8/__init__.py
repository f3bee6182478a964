"""Entry point of the fp8 quantization method (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

# the quantization hook is new in the next API (1.7 proposed): raise this when the core ships it
MINISGL_API = "1.6"


@hookimpl
def minisgl_register_quantization_methods(register):
    register("fp8", "minisgl_plugin_fp8.method:Fp8Method")

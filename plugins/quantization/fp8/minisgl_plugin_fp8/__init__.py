"""Entry point of the fp8 quantization methods (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.1"  # quantize_experts (API 2.1)


@hookimpl
def minisgl_register_quantization_methods(register):
    register("fp8", "minisgl_plugin_fp8.method:Fp8Method")
    register("fp8-head", "minisgl_plugin_fp8.method:Fp8HeadMethod")

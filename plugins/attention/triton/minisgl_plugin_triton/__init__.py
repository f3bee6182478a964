"""Registers the Triton decode attention backend; imports nothing heavy (no Triton, no torch.cuda)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.7"  # AttentionConfig.sliding_window/window_layers, "sliding_window" (API 2.7)


@hookimpl
def minisgl_register_attention_backends(register) -> None:
    register("triton", "minisgl_plugin_triton.backend:TritonDecodeBackend")

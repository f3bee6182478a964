"""Registers the FlashInfer attention backend; imports nothing heavy (no torch.cuda, no flashinfer)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.7"  # AttentionConfig.sliding_window/window_layers, "sliding_window" (API 2.7)


@hookimpl
def minisgl_register_attention_backends(register) -> None:
    register("fi", "minisgl_plugin_fi.backend:FlashInferBackend")

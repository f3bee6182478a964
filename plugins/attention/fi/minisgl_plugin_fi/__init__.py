"""Registers the FlashInfer attention backend; imports nothing heavy (no torch.cuda, no flashinfer)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.6"  # AttentionConfig.logits_soft_cap, the "soft_cap" capability (API 2.6)


@hookimpl
def minisgl_register_attention_backends(register) -> None:
    register("fi", "minisgl_plugin_fi.backend:FlashInferBackend")

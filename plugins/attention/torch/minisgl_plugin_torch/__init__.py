"""Registers the pure-PyTorch attention backend; imports nothing heavy."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.6"  # AttentionConfig.logits_soft_cap, the "soft_cap" capability (API 2.6)


@hookimpl
def minisgl_register_attention_backends(register) -> None:
    register("torch", "minisgl_plugin_torch.backend:TorchAttentionBackend")

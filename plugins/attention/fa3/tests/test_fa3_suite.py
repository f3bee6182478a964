"""The fa3 backend on a Hopper GPU: the attention conformance suite in bfloat16, on whichever
prefill path is installed (FlashAttention-3 or FlashInfer's SM90 kernels). Skipped elsewhere."""

from __future__ import annotations

import torch
from minisgl_plugin_fa3.backend import FlashAttention3Backend

from minisgl_core.testing.attention_suite import AttentionBackendSuite


class TestFlashAttention3Backend(AttentionBackendSuite):
    backend_cls = FlashAttention3Backend
    device = "cuda"
    dtype = torch.bfloat16
    atol = 2e-2
    rtol = 2e-2

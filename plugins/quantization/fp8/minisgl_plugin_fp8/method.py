"""FP8 (e4m3) linear layers: weights quantized at load with one scale per output channel,
activations quantized per token on the fly, multiplied by ``torch._scaled_mm`` (FP8 tensor cores
of Hopper and Ada) with both scales applied in its epilogue.

At one token (``GEMV_MAX_M``), as in batch-1 decoding, a Triton kernel (:mod:`minisgl_plugin_fp8.gemv`)
runs instead: the same arithmetic (it quantizes the activation row itself, as ``quantize_rows``
does), as one stream over the e4m3 weights. cuBLASLt's FP8 GEMM plus the separate activation
quantizer ran slower than bf16 at one token. Both paths round the same way, so a token's logits
do not depend on the batch it rides in beyond float32 summation order.

Mixture-of-experts layers' experts (:meth:`Fp8Method.quantize_experts`) get the same e4m3 values
with one scale per row; the core's grouped GEMMs multiply them by e4m3 activations rounded as
:func:`quantize_rows` rounds them (W8A8, the FP8 tensor cores). On GPUs older than Ada (no e4m3 in
Triton) the experts stay in the run dtype. The rounding (``quantize_rows``, its Triton kernel)
lives in the core (``minisgl_core.layers.e4m3`` / ``triton_e4m3``), shared with those GEMMs.

Elsewhere (CPU, older GPUs, a float32 or float16 run, shapes the kernel refuses) the layer emulates
the same arithmetic: the same quantized weights and per-token activations, their e4m3 values
multiplied and summed exactly (float64), both scales applied after, rounded once to the run
dtype, so the numerics measured on CPU are the GPU's up to its float32 accumulation order. The emulation keeps a float64 copy of each weight's e4m3 values
(summed exactly, so a token's result does not depend on its batch): it is for testing, not for
memory.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from minisgl_core.api import QuantizationMethod
from minisgl_core.layers.e4m3 import FP8, FP8_MAX, quantize_rows  # noqa: F401 (FP8_MAX: the tests take it here)
from minisgl_core.layers.fused import compiled_kernels
from minisgl_core.layers.moe import quantize_stack


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` of the activations: on CUDA one Triton kernel (instead of six per
    layer), whose arithmetic is the one-token GEMV's, so a token's e4m3 row is the same bits
    whichever path its batch takes (``torch.compile`` of :func:`quantize_rows` was the kernel
    before: its division is not ours to choose); ``--disable-fast-path compile`` (or
    ``MINISGL_COMPILE=0``) runs it eagerly."""
    if not compiled_kernels(x):
        return quantize_rows(x)
    from minisgl_plugin_fp8.gemv import quantize_rows_triton

    return quantize_rows_triton(x)


#: module switch (ablation, benchmarks): False sends every token count to ``torch._scaled_mm``
GEMV_ENABLED = True
#: most tokens the GEMV takes (as minisgl_plugin_fp8.gemv.GEMV_MAX_M, without importing Triton)
GEMV_MAX_M = 1


def gemv_applies(tokens: int, fp8_native: bool) -> bool:
    """Whether a native FP8 layer multiplies ``tokens`` rows with the GEMV (else
    ``torch._scaled_mm``); emulated layers never do."""
    return GEMV_ENABLED and fp8_native and 0 < tokens <= GEMV_MAX_M


@functools.cache
def _gemv():
    from minisgl_plugin_fp8 import gemv

    assert gemv.GEMV_MAX_M == GEMV_MAX_M
    return gemv.fp8_gemv


def scaled_mm_supported(device: torch.device) -> bool:
    """FP8 GEMMs with row-wise scales: CUDA compute capability 8.9 (Ada) or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


class Fp8Method(QuantizationMethod):
    name = "fp8"

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device=device, dtype=dtype)
        # row-wise scaled _scaled_mm writes bfloat16 only
        self.native = scaled_mm_supported(self.device) and dtype == torch.bfloat16
        self.native_layers = 0
        self.emulated_layers = 0
        self.expert_stacks = 0

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        weight = layer.weight.data
        q, scale = quantize_rows(weight)
        out_features, in_features = q.shape
        layer.weight = nn.Parameter(q, requires_grad=False)
        # [1, out]: the layout _scaled_mm wants for scale_b
        layer.weight_scale = scale.view(1, out_features).contiguous()
        # _scaled_mm needs both dimensions of the weight divisible by 16
        layer.fp8_native = self.native and in_features % 16 == 0 and out_features % 16 == 0
        if layer.fp8_native:
            self.native_layers += 1
        else:
            # the e4m3 values in float64, the scales applied after the sum (as the kernels do):
            # a product of two e4m3 values has at most 8 significant bits and every one is a
            # multiple of 2**-18 below 2**18, so float64 sums them exactly in any order (for rows
            # of up to 2**17 columns) and a token's result does not depend on the batch. A float32
            # product (MKL's blocking follows the row count) moved results by a few ulps between
            # batch sizes, and e4m3 rounding of the next layer's activations turned those into whole
            # e4m3 steps: greedy output with speculative decoding parted from it without (a probe
            # on the default model) and a request alone parted from it in a batch
            layer.fp8_values = q.double()
            self.emulated_layers += 1

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        # (--disable-fast-path compile turns the GEMV off too: a token then rounds as in a batch)
        if gemv_applies(x2.shape[0], layer.fp8_native) and compiled_kernels(x2):
            out = _gemv()(x2, layer.weight, layer.weight_scale)
        elif layer.fp8_native:
            xq, x_scale = quantize_tokens(x2)
            out = torch._scaled_mm(
                xq,
                layer.weight.t(),
                scale_a=x_scale,
                scale_b=layer.weight_scale,
                out_dtype=x.dtype,
            )
        else:
            xq, x_scale = quantize_rows(x2)
            exact = xq.double() @ layer.fp8_values.t()
            out = (exact * x_scale.double() * layer.weight_scale.double()).to(x.dtype)
        return out.view(*shape[:-1], out.shape[-1])

    def quantize_experts(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each expert's rows as :func:`quantize_rows` rounds a linear layer's; None on a GPU without
        e4m3 (before Ada)."""
        if weight.is_cuda and not scaled_mm_supported(weight.device):
            return None
        self.expert_stacks += 1
        return quantize_stack(weight, quantize_rows, FP8)

    def describe(self) -> dict[str, Any]:
        return {
            "quantization": "fp8",
            "scaled_mm_layers": self.native_layers,
            "emulated_layers": self.emulated_layers,
            "expert_stacks": self.expert_stacks,
            # tokens up to which native layers run the GEMV (0: never)
            "gemv_max_m": GEMV_MAX_M if GEMV_ENABLED and self.native else 0,
        }


class Fp8HeadMethod(Fp8Method):
    """``--quantization fp8-head``: :class:`Fp8Method` plus the LM head, with the same per-row
    scales and per-token activations (the head is the largest single read of a batch-1 step:
    1 GB of Llama-3.1-8B's 16 in bf16; the FP8 bandwidth bound counts it in e4m3). With tied
    embeddings the head gets its own e4m3 table and the input embedding keeps the run dtype's."""

    name = "fp8-head"
    quantizes_lm_head = True

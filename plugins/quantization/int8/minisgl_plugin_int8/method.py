"""Int8 weight-only linear layers: weights rounded at load to int8 with one scale per output
channel; activations stay in the run dtype.

On CPU the product is ``torch.ops.aten._weight_int8pack_mm`` (reads the int8 weight directly:
a quarter of float32's bytes, which is what batch-1 decoding on a CPU waits for). Elsewhere the
weight is dequantized for each product, correct but not faster than the run dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api import QuantizationMethod

INT8_MAX = 127
MIN_SCALE = 1e-12
#: the activation dtypes _weight_int8pack_mm accepts on CPU
PACKED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] as (int8 [out, in], float32 scale [out]), symmetric, round to nearest."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp_(min=MIN_SCALE)
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


class Int8Method(QuantizationMethod):
    name = "int8"

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device=device, dtype=dtype)
        self.packed = self.device.type == "cpu" and dtype in PACKED_DTYPES

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_weight(layer.weight.data)
        layer.weight = nn.Parameter(q, requires_grad=False)
        # the kernel wants the scales in the activations' dtype
        layer.weight_scale = scale.to(self.dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.packed:
            out = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), layer.weight, layer.weight_scale)
        else:
            out = F.linear(x2, layer.weight.to(x.dtype)) * layer.weight_scale
        return out.view(*shape[:-1], out.shape[-1])

    def describe(self) -> dict[str, Any]:
        return {"quantization": "int8", "kernel": "_weight_int8pack_mm" if self.packed else "dequantize"}

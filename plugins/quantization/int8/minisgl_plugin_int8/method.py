"""Int8 weight-only linear layers: weights rounded at load to int8 with one scale per output
channel; activations stay in the run dtype.

On a CPU with AVX-512, in bfloat16, the product is ``torch.ops.aten._weight_int8pack_mm`` (reads
the int8 weight directly: a quarter of float32's bytes, which is what batch-1 decoding on a CPU
waits for); in float32 that kernel is slower than dequantizing, so a float32 run dequantizes (for
CPU speed use ``--quantization int4``, which runs its kernel in bfloat16 whatever the run dtype).
Without AVX-512 that kernel takes a scalar path: on the 2-core AVX2 dev machine it took
3.3 ms for a 1536x576 product at one token against 0.08 ms for float32 (44 ms vs 0.4 at 8 tokens,
one thread), so there, and on GPUs, the weight is dequantized for each product instead: correct,
a quarter of the memory at rest, but not faster than the run dtype.

Mixture-of-experts layers' experts (:meth:`Int8Method.quantize_experts`) are rounded the same way,
one scale per row; the core's grouped GEMMs convert them in the kernel (on the GPU: half of bf16's
bytes read) and its CPU loop multiplies them in float32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api import QuantizationMethod
from minisgl_core.layers.moe import quantize_stack

INT8_MAX = 127
MIN_SCALE = 1e-12
#: the run dtypes _weight_int8pack_mm is used for on an AVX-512 CPU. It accepts float32 and
#: float16 too, but there it is slower than dequantizing (2-core AVX-512 + BF16 dev VM, 1536x576 at
#: one token: float32 0.54 ms against 0.25 dequantized and 0.11 for the float32 weight; bfloat16
#: 0.041 ms against 0.16 dequantized)
PACKED_DTYPES = (torch.bfloat16,)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] as (int8 [out, in], float32 scale [out]), symmetric, round to nearest."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / INT8_MAX).clamp_(min=MIN_SCALE)
    q = torch.round(w / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def packed_kernel_is_fast() -> bool:
    """``_weight_int8pack_mm`` has a vectorized CPU path only with AVX-512 (see the module doc)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


class Int8Method(QuantizationMethod):
    name = "int8"

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device=device, dtype=dtype)
        self.packed = self.device.type == "cpu" and dtype in PACKED_DTYPES and packed_kernel_is_fast()

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        q, scale = quantize_weight(layer.weight.data)
        layer.weight = nn.Parameter(q, requires_grad=False)
        # the kernel wants the scales in the activations' dtype; float16 keeps float32 ones (they
        # scale the weight before the product, and a row's small scale would be subnormal there)
        layer.weight_scale = scale.to(torch.float32 if self.dtype == torch.float16 else self.dtype)
        # float16 scales the weight by its scale times this power of two, then by its inverse:
        # a small row's scale is subnormal in float16; a huge row's boosted weight would overflow
        layer.weight_scale_boost = 128.0 if float(scale.max()) * 128 * INT8_MAX < 60000 else 1.0

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.packed:
            out = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), layer.weight, layer.weight_scale)
        elif x.dtype == torch.float16:
            # scaled before the product: the int8 values (up to 127) times a real model's outlier
            # activations summed past float16's 65,504, and the run answered with token 0 only.
            # One float16 copy of the weight, as the other dtypes make; the boosted scale, then
            # the exact inverse power of two.
            boost = layer.weight_scale_boost
            weight = layer.weight.to(x.dtype)
            weight.mul_((layer.weight_scale * boost).to(x.dtype)[:, None]).mul_(1 / boost)
            out = F.linear(x2, weight)
        else:
            out = F.linear(x2, layer.weight.to(x.dtype)) * layer.weight_scale
        return out.view(*shape[:-1], out.shape[-1])

    def quantize_experts(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each expert's rows as :func:`quantize_weight` rounds a linear layer's."""
        return quantize_stack(weight, quantize_weight, torch.int8)

    def describe(self) -> dict[str, Any]:
        return {"quantization": "int8", "kernel": "_weight_int8pack_mm" if self.packed else "dequantize"}

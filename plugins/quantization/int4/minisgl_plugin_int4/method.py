"""Int4 weight-only linear layers: weights rounded at load to 4 bits in groups of 32 along the
input features, each group with its own scale and minimum (``w = scale * q + minimum``, q in
0..15, the layout of GGUF's Q4_1); activations stay in the run dtype.

Why this layout: llama.cpp's Q4_1 quantizer sets a group's minimum to the group's smallest value
and its scale to (max - min) / 15, so every group holds q = 0 and q = 15. Re-quantizing the
dequantized weights of a Q4_1 checkpoint with each group's (min, max) therefore gives back the
file's q and minimums, and its scales up to float32 rounding: on the default model
(SmolLM2-135M-Instruct, Q4_1 linear layers) the layers lose only what the kernel rounds to bf16.
Any other checkpoint is quantized the usual way (round to nearest, asymmetric).

On a CPU whose ATen build has a vectorized int4 kernel (AVX-512 or AVX2 dispatch) the product is
``torch.ops.aten._weight_int4pack_mm_for_cpu`` with the activations cast to bfloat16 (its float32
and float16 paths are 10-20x slower) and the output cast back: an eighth of float32's bytes per
weight, which is what a decode step on a CPU waits for. The kernel needs the output features to
be a multiple of 16; a layer that is not is dequantized per product instead, as is every layer on
other devices (correct, an eighth of the memory at rest, not faster). A layer whose input
features are not a multiple of 32 stays in the run dtype.

Two methods: ``int4`` leaves the LM head in the run dtype; ``int4-head`` also quantizes it, as
*two* int4 terms (the weight, then what the first term missed), because one int4 term loses the
answers (greedy agreement with transformers on the default model fell from 98.9% to 24.7%: "12 +
7 = 8") while two keep about 8 bits per group (92.6%) and still read a quarter of float32's bytes.
The tied embedding keeps its run-dtype table (a step reads only its tokens' rows of it).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api import QuantizationMethod
from minisgl_core.layers.embedding import ParallelLMHead

logger = logging.getLogger(__name__)

GROUP_SIZE = 32
#: q runs over 0..QMAX
QMAX = 15
#: the scale of a constant group (any positive value gives q = 0 there)
MIN_SCALE = 1e-12
#: _weight_int4pack_mm_for_cpu wants the output features in multiples of this
PACKED_N_MULTIPLE = 16
#: the packing's inner k tiles (the CPU kernel's layout; 2 is what its own tests use)
INNER_K_TILES = 2
#: ATen dispatch levels with a vectorized int4 kernel (the DEFAULT one is scalar: ~100x slower)
FAST_CAPABILITIES = ("AVX512", "AVX2")


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] (in a multiple of 32) as (q uint8 [out, in] in 0..15, float32 scale
    [out, in / 32], float32 minimum [out, in / 32]); ``weight ≈ scale * q + minimum`` per group."""
    rows, cols = weight.shape
    if cols % GROUP_SIZE:
        raise ValueError(f"in_features={cols} is not a multiple of the group size {GROUP_SIZE}")
    groups = weight.float().reshape(rows, cols // GROUP_SIZE, GROUP_SIZE)
    minimum = groups.amin(dim=-1)
    scale = ((groups.amax(dim=-1) - minimum) / QMAX).clamp_(min=MIN_SCALE)
    q = torch.round((groups - minimum[..., None]) / scale[..., None]).clamp_(0, QMAX)
    return q.to(torch.uint8).reshape(rows, cols), scale, minimum


def dequantize(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor) -> torch.Tensor:
    """``scale * q + minimum`` per group, [out, in], in the scale's dtype."""
    rows = q.shape[0]
    groups = q.to(scale.dtype).view(rows, -1, GROUP_SIZE) * scale[..., None] + minimum[..., None]
    return groups.view(rows, -1)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in] in 0..15 as uint8 [out, in / 2]: column 2j in the low nibble, 2j+1 high."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def pack_for_cpu_kernel(
    q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The (packed weight, bf16 scales and zeros [in / 32, out, 2]) that
    ``_weight_int4pack_mm_for_cpu`` reads; it computes ``(q - 8) * scale + zero`` per group."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), INNER_K_TILES)
    scales_zeros = torch.stack((scale, minimum + 8 * scale), dim=-1).transpose(0, 1)
    return packed, scales_zeros.to(torch.bfloat16).contiguous()


def packed_kernel_is_fast() -> bool:
    """Whether ATen dispatches ``_weight_int4pack_mm_for_cpu`` to a vectorized kernel here."""
    return torch.backends.cpu.get_cpu_capability() in FAST_CAPABILITIES


def _int4pack_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP_SIZE, scales_zeros)


class Int4Method(QuantizationMethod):
    """``--quantization int4``: the linear layers in int4, the LM head in the run dtype."""

    name = "int4"

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(device=device, dtype=dtype)
        self.packed = self.device.type == "cpu" and packed_kernel_is_fast()
        #: how many layers each kernel serves ("int4pack_mm", "dequantize", "unquantized", ...)
        self.counts: dict[str, int] = {}

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if isinstance(layer, ParallelLMHead):
            kernel = self._process_lm_head(layer)
        else:
            kernel = self._process_linear(layer)
        layer.int4_kernel = kernel
        self.counts[kernel] = self.counts.get(kernel, 0) + 1

    def _process_linear(self, layer: nn.Module) -> str:
        rows, cols = layer.weight.shape
        if cols % GROUP_SIZE:
            return "unquantized"  # apply() multiplies the run-dtype weight
        q, scale, minimum = quantize_weight(layer.weight.data)
        if self.packed and rows % PACKED_N_MULTIPLE == 0:
            packed, scales_zeros = pack_for_cpu_kernel(q, scale, minimum)
            layer.weight = nn.Parameter(packed, requires_grad=False)
            layer.register_buffer("weight_scales_zeros", scales_zeros, persistent=False)
            return "int4pack_mm"
        layer.weight = nn.Parameter(pack_nibbles(q), requires_grad=False)
        layer.register_buffer("weight_scale", scale.to(self.dtype), persistent=False)
        layer.register_buffer("weight_min", minimum.to(self.dtype), persistent=False)
        return "dequantize"

    def _process_lm_head(self, layer: nn.Module) -> str:
        """Only :class:`Int4HeadMethod` is handed the head; two int4 terms, packed kernel only
        (elsewhere the head stays in the run dtype: dequantizing 2 terms per step gains nothing)."""
        rows, cols = layer.weight.shape
        if not (self.packed and cols % GROUP_SIZE == 0 and rows % PACKED_N_MULTIPLE == 0):
            return "unquantized"
        weight = layer.weight.data.float()
        q, scale, minimum = quantize_weight(weight)
        residual = quantize_weight(weight - dequantize(q, scale, minimum))
        packed, scales_zeros = pack_for_cpu_kernel(q, scale, minimum)
        residual_packed, residual_scales_zeros = pack_for_cpu_kernel(*residual)
        # a new Parameter: a tied head stops sharing the input embedding's table here
        layer.weight = nn.Parameter(packed, requires_grad=False)
        layer.register_buffer("weight_scales_zeros", scales_zeros, persistent=False)
        layer.register_buffer("residual_weight", residual_packed, persistent=False)
        layer.register_buffer("residual_scales_zeros", residual_scales_zeros, persistent=False)
        return "int4pack_mm x2"

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        kernel = layer.int4_kernel
        if kernel == "unquantized":
            return F.linear(x, layer.weight)
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if kernel == "dequantize":
            weight = dequantize(unpack_nibbles(layer.weight), layer.weight_scale, layer.weight_min)
            out = F.linear(x2, weight.to(x.dtype))
        else:
            x_bf16 = x2.to(torch.bfloat16).contiguous()
            out = _int4pack_mm(x_bf16, layer.weight, layer.weight_scales_zeros).to(x.dtype)
            if kernel == "int4pack_mm x2":
                out += _int4pack_mm(x_bf16, layer.residual_weight, layer.residual_scales_zeros).to(x.dtype)
        return out.view(*shape[:-1], out.shape[-1])

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"quantization": self.name, "group_size": GROUP_SIZE}
        info["kernel"] = "_weight_int4pack_mm_for_cpu (bf16 activations)" if self.packed else "dequantize"
        info["layers"] = dict(self.counts)
        unquantized = self.counts.get("unquantized", 0)
        if unquantized:
            info["unquantized"] = (
                f"in_features not a multiple of {GROUP_SIZE}"
                + ("" if self.packed else ", or the LM head (quantized only for the packed CPU kernel)")
                + ": those layers stay in the run dtype"
            )
        if unquantized and unquantized == sum(self.counts.values()):
            logger.warning(
                "--quantization %s left all %d layers it was handed in the run dtype (in_features "
                "not a multiple of %d): it quantizes nothing on this model",
                self.name, unquantized, GROUP_SIZE,
            )  # fmt: skip
        return info


class Int4HeadMethod(Int4Method):
    """``--quantization int4-head``: :class:`Int4Method` plus the LM head as two int4 terms."""

    name = "int4-head"
    quantizes_lm_head = True

"""``--quantization``: the method a rank builds and the linear layers it is handed.

See :mod:`minisgl_core.api.quantization` for the order of the steps; this module runs them around
the model's weight loading.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from minisgl_core.api import QuantizationMethod
from minisgl_core.layers.embedding import ParallelLMHead
from minisgl_core.layers.moe import Experts
from minisgl_core.plugins import Plugins

logger = logging.getLogger(__name__)


def make_quantization(
    name: str | None, plugins: Plugins, device: torch.device, dtype: torch.dtype
) -> QuantizationMethod | None:
    """The method registered as ``name`` (None: no quantization); PluginError saying why not."""
    if not name or name == "none":
        return None
    return plugins.resolve_on_device("quantization", name, device)(device=device, dtype=dtype)


def quantizable_layers(model: nn.Module) -> list[nn.Module]:
    """The layers a method is handed: every module with a ``quant_method`` slot (the linear layers
    of :mod:`minisgl_core.layers`), in model order; the LM head is not one of them."""
    return [m for m in model.modules() if hasattr(m, "quant_method") and not isinstance(m, ParallelLMHead)]


def lm_heads(model: nn.Module) -> list[nn.Module]:
    """The LM head(s), handed only to a method that sets ``quantizes_lm_head``."""
    return [m for m in model.modules() if isinstance(m, ParallelLMHead)]


def before_loading(model: nn.Module, method: QuantizationMethod) -> None:
    for layer in quantizable_layers(model):
        method.create_weights(layer)
        layer.quant_method = method


def after_loading(model: nn.Module, method: QuantizationMethod) -> None:
    layers = quantizable_layers(model)
    for layer in layers:
        method.process_weights_after_loading(layer)
    if method.quantizes_lm_head:
        for head in lm_heads(model):
            method.process_weights_after_loading(head)
            head.quant_method = method
            layers.append(head)
    name = method.name or type(method).__name__
    stacks = [m for m in model.modules() if isinstance(m, Experts)]
    kept = 0
    for experts in stacks:
        quantized = [method.quantize_experts(w.data) for w in (experts.w13, experts.w2)]
        if any(q is None for q in quantized):
            kept += 1
            continue
        experts.quantize(quantized, f"--quantization {name}")  # type: ignore[arg-type]
    if method.device.type == "cuda":
        torch.cuda.empty_cache()  # the run-dtype weights are gone: the KV pool may take their room
    # the count is of the layers handed over: a method may keep some in the run dtype, which its
    # describe() says (int4 with in_features not a multiple of its group, for one)
    logger.info(
        "--quantization %s was handed %d linear layers and quantized %d mixture-of-experts "
        "blocks' experts: %s",
        name, len(layers), len(stacks) - kept, method.describe(),
    )  # fmt: skip
    if kept:
        logger.warning(
            "%d mixture-of-experts blocks keep their experts in %s: --quantization %s does not "
            "quantize experts (on this device, or at all); it quantizes the linear layers",
            kept, str(method.dtype).removeprefix("torch."), name,
        )  # fmt: skip

"""Weight quantization of linear layers: the :class:`QuantizationMethod` a plugin implements.

The core picks the method registered under ``--quantization NAME`` and hands it every linear
layer of :mod:`minisgl_core.layers` (fused q/k/v, gate/up, the output and down projections;
embeddings stay in the run dtype, and so does the LM head unless the method sets
:attr:`QuantizationMethod.quantizes_lm_head`). Its life with each layer, in order:

1. :meth:`QuantizationMethod.create_weights`, after the model is built and before any checkpoint
   tensor is read: replace parameters when the checkpoint itself is quantized (AWQ, GPTQ: packed
   weights with their own ``weight_loader``); by default nothing, so the layer's ``weight`` loads
   in the run dtype as usual.
2. The checkpoint loads through the parameters' ``weight_loader``.
3. :meth:`QuantizationMethod.process_weights_after_loading`: quantize at load (``fp8``, ``int8``)
   or repack a loaded checkpoint for the kernel.
4. Every forward calls :meth:`QuantizationMethod.apply` instead of ``F.linear``; the layer adds
   its bias (after the all-reduce for a row-parallel layer).

Mixture-of-experts layers keep every expert's matrices stacked (``[experts, rows, columns]``) and
multiply them in the core's grouped GEMMs, so a method does not multiply them itself: after
loading, :meth:`QuantizationMethod.quantize_experts` may hand back each stack as quantized values
with a scale a row, which those GEMMs read (API 2.1).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn


class QuantizationMethod(ABC):
    """How linear layers keep and multiply their weights; one object per scheduler rank.

    Built as ``cls(device=..., dtype=...)`` (``dtype`` is the run dtype: activations in and out)."""

    #: the name users pass to ``--quantization`` (informational; the registration decides)
    name: ClassVar[str] = ""
    #: True: the LM head is handed to :meth:`process_weights_after_loading` and :meth:`apply`
    #: too (not to :meth:`create_weights`: it loads as usual). Its ``weight`` is
    #: ``[vocab rows of this rank, hidden]``, it has no bias, and with tied embeddings it is the
    #: input embedding's table: replacing ``layer.weight`` unties them (the embedding keeps the
    #: run-dtype table). Default False: the head multiplies in the run dtype.
    quantizes_lm_head: ClassVar[bool] = False

    def __init__(self, *, device: torch.device, dtype: torch.dtype) -> None:
        self.device = torch.device(device)
        self.dtype = dtype

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        """None when the method can run on ``device``, else why not (one line, shown to the user).

        Cheap: called before the model is built; no kernel compilation here."""
        return None

    def create_weights(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """Adapt ``layer``'s parameters before the checkpoint loads (default: keep them).

        ``layer`` has ``weight`` (``[out_features, in_features]`` of this rank, run dtype, carrying
        ``weight_loader`` and ``shard_ids``) and ``bias`` (or None). A method reading pre-quantized
        checkpoints replaces ``weight`` with its own parameters, each with a ``weight_loader``."""

    @abstractmethod
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded weights into what :meth:`apply` reads (quantize, repack, add scales).

        Replace ``layer.weight`` rather than change its dtype in place: the run-dtype tensor is
        then freed."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T`` for ``x`` of shape ``[..., in_features]`` in the run dtype; the result has
        shape ``[..., out_features]`` and the run dtype. No bias: the layer adds it. Must be
        capturable in a CUDA graph on GPU (no host syncs, no allocation that depends on data)."""

    def quantize_experts(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A mixture-of-experts layer's stacked expert matrices as quantized values, or None (the
        default) to keep them in the run dtype. Called once per stack after loading (gate/up
        ``[experts, 2 * intermediate, hidden]`` and down ``[experts, hidden, intermediate]``, this
        rank's share, run dtype).

        Return ``(values, scales)`` on ``weight``'s device with ``weight[e, r] ≈ values[e, r] *
        scales[e, r]``: ``values`` of ``weight``'s shape in ``torch.int8`` or
        ``torch.float8_e4m3fn`` (CUDA compute capability 8.9 or newer), ``scales`` float32
        ``[experts, rows]``. int8 values are weight-only: the core's grouped GEMMs convert each
        exactly to the run dtype and sum its products with the activations in float32. e4m3
        values multiply e4m3 activations (W8A8): the core rounds each GEMM's input rows to e4m3
        with a scale a row (the fp8 method's per-token rounding) and multiplies on the FP8 tensor
        cores. Either way each output row is scaled after the sum. Anything else is refused at
        load with an error naming the method.
        *Since API 2.1.*"""
        return None

    def describe(self) -> dict[str, Any]:
        """What ``minisgl`` logs at load (override to add details such as the kernel chosen)."""
        return {"quantization": self.name or type(self).__name__}

"""Conformance suite that every :class:`~minisgl_core.api.QuantizationMethod` runs.

    from minisgl_core.testing.quantization_suite import QuantizationMethodSuite

    class TestMyMethod(QuantizationMethodSuite):
        method_cls = MyMethod         # or "module:Class", or the registered name ("mine")
        max_relative_error = 0.02     # what your format's rounding allows

Each linear layer of :mod:`minisgl_core.layers` (fused q/k/v, merged gate/up, row-parallel;
with and without bias) goes through the core's steps (``create_weights``, the checkpoint load
through the parameters' ``weight_loader``, ``process_weights_after_loading``) and its output is
compared with ``F.linear`` of the unquantized weights on random inputs: the relative error
(Frobenius norm) must stay under ``max_relative_error``. A method that quantizes mixture-of-experts
experts (``quantize_experts``, API 2.1) has them checked the same way, through the core's
:class:`~minisgl_core.layers.moe.Experts` (on a GPU its grouped GEMMs), within twice the bound (two
products in a row). Set ``device``/``dtype`` to
run the same checks on a GPU (the suite skips when the device is missing or the method declines it).
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minisgl_core.api import ParallelContext, QuantizationMethod
from minisgl_core.layers import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from minisgl_core.testing.targets import resolve

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, INTERMEDIATE = 256, 32, 8, 2, 512


def _checkpoint(layer_kind: str, bias: bool, generator: torch.Generator) -> dict[Any, torch.Tensor]:
    """shard_id -> full checkpoint tensor (weights ~ N(0, 0.05), a few large outliers per row)."""

    def weight(rows: int, cols: int) -> torch.Tensor:
        w = torch.randn(rows, cols, generator=generator) * 0.05
        w[:, torch.randint(0, cols, (2,), generator=generator)] *= 8  # outlier columns, as in real models
        return w

    if layer_kind == "qkv":
        shapes = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}
        parts = {sid: weight(rows, HIDDEN) for sid, rows in shapes.items()}
    elif layer_kind == "merged":
        parts = {0: weight(INTERMEDIATE, HIDDEN), 1: weight(INTERMEDIATE, HIDDEN)}
    else:
        parts = {None: weight(HIDDEN, INTERMEDIATE)}
    out = {("weight", sid): w for sid, w in parts.items()}
    if bias:
        for sid, w in parts.items():
            out["bias", sid] = torch.randn(w.shape[0], generator=generator) * 0.1
    return out


class QuantizationMethodSuite:
    #: the method: its class, "package.module:Class", or a name an installed plugin registers
    method_cls: ClassVar[type[QuantizationMethod] | str]
    device: ClassVar[str] = "cpu"
    dtype: ClassVar[torch.dtype] = torch.float32
    #: the largest relative error (Frobenius) of a layer's output against the unquantized layer
    max_relative_error: ClassVar[float] = 0.05

    @classmethod
    def method_class(cls) -> type[QuantizationMethod]:
        if getattr(cls, "method_cls", None) is None:
            raise TypeError(f"{cls.__name__} must set method_cls")
        return resolve("quantization", cls.method_cls)

    @pytest.fixture
    def method(self) -> QuantizationMethod:
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        method_cls = self.method_class()
        why = method_cls.availability(device)
        if why is not None:
            pytest.skip(f"{method_cls.__name__} unavailable on {device}: {why}")
        return method_cls(device=device, dtype=self.dtype)

    def _layer(self, layer_kind: str, bias: bool) -> nn.Module:
        options = {"parallel": ParallelContext(), "bias": bias, "dtype": self.dtype, "device": self.device}
        if layer_kind == "qkv":
            return QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, **options)
        if layer_kind == "merged":
            return MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE, INTERMEDIATE], **options)
        return RowParallelLinear(INTERMEDIATE, HIDDEN, **options)

    def _loaded(
        self, method: QuantizationMethod, layer_kind: str, bias: bool
    ) -> tuple[nn.Module, torch.Tensor, torch.Tensor | None]:
        """(quantized layer, unquantized weight, unquantized bias) through the core's steps."""
        # crc32, not hash(): str hashes change with each process (PYTHONHASHSEED), and so did the
        # weights, which let int4's qkv at one token land either side of its bound (CI, 2026-11-26)
        generator = torch.Generator().manual_seed(zlib.crc32(f"{layer_kind}/{bias}".encode()))
        checkpoint = _checkpoint(layer_kind, bias, generator)
        reference = self._layer(layer_kind, bias)
        layer = self._layer(layer_kind, bias)
        method.create_weights(layer)
        layer.quant_method = method
        for target in (reference, layer):
            params = dict(target.named_parameters())
            for (name, shard_id), tensor in checkpoint.items():
                param = params[name]
                param.weight_loader(param, tensor.to(self.dtype).to(self.device), shard_id)
        method.process_weights_after_loading(layer)
        bias_ref = None if reference.bias is None else reference.bias.data
        return layer, reference.weight.data, bias_ref

    @pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
    @pytest.mark.parametrize("layer_kind", ["qkv", "merged", "row"])
    def test_layer_output_is_close_to_unquantized(self, method, layer_kind: str, bias: bool) -> None:
        layer, weight, bias_ref = self._loaded(method, layer_kind, bias)
        generator = torch.Generator().manual_seed(7)
        for tokens in (1, 5, 33):
            x = torch.randn(tokens, weight.shape[1], generator=generator).to(self.dtype).to(self.device)
            with torch.inference_mode():
                out = layer(x)
            expected = F.linear(x.double(), weight.double(), None if bias_ref is None else bias_ref.double())
            assert out.shape == expected.shape and out.dtype == self.dtype
            error = (out.double() - expected).norm() / expected.norm()
            assert error < self.max_relative_error, (
                f"{layer_kind}, {tokens} tokens: relative error {error:.4f}"
            )

    def test_apply_keeps_leading_dimensions(self, method) -> None:
        layer, weight, _ = self._loaded(method, "merged", False)
        x = torch.randn(2, 3, weight.shape[1]).to(self.dtype).to(self.device)
        with torch.inference_mode():
            out = layer(x)
            flat = layer(x.reshape(6, -1))
        assert out.shape == (2, 3, weight.shape[0])
        torch.testing.assert_close(out.reshape(6, -1), flat)

    def test_weight_is_stored_in_fewer_bytes(self, method) -> None:
        layer, weight, _ = self._loaded(method, "row", False)
        stored = layer.weight.numel() * layer.weight.element_size()
        assert stored < weight.numel() * weight.element_size(), f"weight kept as {layer.weight.dtype}"

    def test_quantized_experts_fit_the_core_and_stay_close(self, method) -> None:
        """``quantize_experts``: None (the experts stay in the run dtype), or values and scales the
        core's ``Experts`` accepts, in fewer bytes, whose block output stays within twice
        ``max_relative_error`` of the unquantized experts' (two quantized products in a row, the
        second's input the first's rounded output: e4m3 experts multiply e4m3 activations)."""
        from minisgl_core.layers.moe import SparseMoE, experts_reference, route

        generator = torch.Generator().manual_seed(zlib.crc32(b"experts"))
        block = SparseMoE(HIDDEN, 64, 4, 2, renormalize=True, parallel=ParallelContext(), dtype=self.dtype,
                          device=self.device)  # fmt: skip
        for param in block.parameters():
            w = torch.randn(param.shape, generator=generator) * 0.05
            w[..., torch.randint(0, param.shape[-1], (2,), generator=generator)] *= 8  # outlier columns
            param.data.copy_(w.to(self.dtype))
        w13, w2 = block.experts.w13.data.clone(), block.experts.w2.data.clone()
        quantized = [method.quantize_experts(w.clone()) for w in (w13, w2)]
        if any(q is None for q in quantized):
            pytest.skip(f"{type(method).__name__} keeps experts in the run dtype on {self.device}")
        block.experts.quantize(quantized, type(method).__name__)  # ValueError when they do not fit
        assert block.experts.w13.element_size() < w13.element_size()
        x = torch.randn(33, HIDDEN, generator=generator).to(self.dtype).to(self.device)
        with torch.inference_mode():
            out = block(x)
            weights, ids = route(block.gate(x), 2, True)
        expected = experts_reference(x.double(), w13.double(), w2.double(), weights.double(), ids)
        error = (out.double() - expected).norm() / expected.norm()
        assert error < 2 * self.max_relative_error, f"experts: relative error {error:.4f}"

    def test_describe_names_the_method(self, method) -> None:
        info = method.describe()
        assert isinstance(info, dict) and info.get("quantization")

"""fp8 against the quantization and packaging conformance suites (the CPU emulation here; the
same suite on CUDA runs ``torch._scaled_mm``), and its quantizer against the float8 format."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minisgl_plugin_fp8 import method as fp8_method
from minisgl_plugin_fp8.method import FP8_MAX, Fp8HeadMethod, Fp8Method, quantize_rows

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.quantization_suite import QuantizationMethodSuite


class TestFp8Float32(QuantizationMethodSuite):
    method_cls = Fp8Method
    # e4m3 keeps 3 mantissa bits: up to 3.8% of the output's norm measured (weights and activations)
    max_relative_error = 0.05


class TestFp8Bfloat16Cuda(QuantizationMethodSuite):
    """The FP8 GEMM itself (skipped without a GPU; tools/device_fp8.sh runs it on one)."""

    method_cls = Fp8Method
    device = "cuda"
    dtype = torch.bfloat16
    max_relative_error = 0.05


class TestFp8HeadFloat32(QuantizationMethodSuite):
    method_cls = Fp8HeadMethod
    max_relative_error = 0.05


class TestFp8HeadBfloat16Cuda(QuantizationMethodSuite):
    method_cls = Fp8HeadMethod
    device = "cuda"
    dtype = torch.bfloat16
    max_relative_error = 0.05


class TestFp8Packaging(PluginPackagingSuite):
    plugin = "fp8"
    provides = {"quantization": ["fp8", "fp8-head"]}


def test_quantize_rows_maps_each_rows_largest_magnitude_to_448():
    t = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [1e4, 3.0, -7.0]])
    q, scale = quantize_rows(t)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (3, 1)
    assert q.float().abs().amax(dim=1).tolist() == [FP8_MAX, 0.0, FP8_MAX]
    torch.testing.assert_close(scale[:, 0], torch.tensor([2 / FP8_MAX, 1e-12, 1e4 / FP8_MAX]))
    # e4m3 round trip: 3 mantissa bits, relative error at most 2**-4 for normal numbers
    back = q.float() * scale
    assert ((back - t).abs() <= t.abs() * 2**-4 + 1e-6).all()


@pytest.mark.parametrize("tokens", [2, fp8_method.GEMV_MAX_M + 1])
def test_emulation_quantizes_activations_per_token(tokens):
    """At every token count (the GPU's GEMV rounds the activations as ``_scaled_mm`` does), and per
    token: a token with one huge entry must not spoil the precision of the other tokens."""
    method = Fp8Method(device=torch.device("cpu"), dtype=torch.float32)
    assert not method.native
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.eye(16), requires_grad=False)
    method.process_weights_after_loading(layer)
    x = torch.full((tokens, 16), 0.01)
    x[0, 0] = 1000.0
    out = method.apply(layer, x)
    torch.testing.assert_close(out[1], x[1], rtol=2**-4, atol=0)  # its own scale: 0.01 is exact-ish
    # while the huge token's own small entries do lose precision under its scale: quantized
    assert not torch.allclose(out[0, 1:], x[0, 1:], rtol=2**-4, atol=0)
    assert layer.weight.dtype == torch.float8_e4m3fn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the FP8 GEMM needs a CUDA device")
def test_scaled_mm_matches_the_emulation_on_a_real_layer_shape():
    """Llama-3.1-8B's gate_up shape: the kernel equals dequantize-then-multiply up to accumulation."""
    device = torch.device("cuda")
    method = Fp8Method(device=device, dtype=torch.bfloat16)
    if not method.native:
        pytest.skip("this GPU has no FP8 tensor cores (compute capability < 8.9)")
    generator = torch.Generator(device=device).manual_seed(0)
    layer = torch.nn.Module()
    weight = torch.randn(28672, 4096, generator=generator, device=device, dtype=torch.bfloat16) * 0.02
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    method.process_weights_after_loading(layer)
    assert layer.fp8_native
    x = torch.randn(37, 4096, generator=generator, device=device, dtype=torch.bfloat16)
    out = method.apply(layer, x)
    xq, x_scale = quantize_rows(x)
    emulated = F.linear(xq.float() * x_scale, layer.weight.float() * layer.weight_scale.view(-1, 1))
    torch.testing.assert_close(out.float(), emulated, rtol=2e-2, atol=2e-2)
    reference = F.linear(x.float(), weight.float())
    assert ((out.float() - reference).norm() / reference.norm()).item() < 0.05


def test_the_emulation_gives_a_token_the_same_bits_in_any_batch():
    """On the CPU the emulated product was float32, whose summation order follows the row count
    (MKL's blocking): a few ulps between batch sizes, which the next layer's e4m3 rounding made
    whole steps, so greedy output with speculative decoding parted from it without on the default
    model (a probe). The e4m3 values are now summed exactly (float64), scales after."""
    import torch
    from minisgl_plugin_fp8.method import Fp8Method
    from torch import nn

    torch.manual_seed(0)
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.randn(1536, 4608) * 0.02, requires_grad=False)
    method = Fp8Method(device=torch.device("cpu"), dtype=torch.float32)
    method.process_weights_after_loading(layer)
    assert not layer.fp8_native
    x = torch.randn(37, 4608)
    batched = method.apply(layer, x)
    for i in (0, 5, 36):
        assert torch.equal(method.apply(layer, x[i : i + 1]), batched[i : i + 1]), i
    assert torch.equal(method.apply(layer, x[3:11]), batched[3:11])
    # and it is the product of the quantized operands, scales after
    from minisgl_plugin_fp8.method import quantize_rows

    xq, x_scale = quantize_rows(x)
    reference = (xq.double() * x_scale.double()) @ (
        layer.weight.double() * layer.weight_scale.double().t()
    ).t()
    torch.testing.assert_close(batched.double(), reference, rtol=1e-6, atol=1e-6)

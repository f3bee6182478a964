"""int8 against the quantization and packaging conformance suites, and its kernel against a
dequantized reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from minisgl_plugin_int8.method import Int8Method, quantize_weight

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.quantization_suite import QuantizationMethodSuite


class TestInt8Float32(QuantizationMethodSuite):
    method_cls = Int8Method
    # round to nearest with one scale per row; the suite's outlier columns set the rows' scales,
    # so the rest round coarsely: up to 2.4% of the output's norm measured
    max_relative_error = 0.03


class TestInt8Bfloat16(QuantizationMethodSuite):
    method_cls = Int8Method
    dtype = torch.bfloat16
    max_relative_error = 0.03


class TestInt8Packaging(PluginPackagingSuite):
    plugin = "int8"
    provides = {"quantization": ["int8"]}


def test_quantize_weight_rounds_each_row_to_its_own_scale():
    w = torch.tensor([[0.5, -1.27, 0.0], [100.0, 1.0, -50.0], [0.0, 0.0, 0.0]])
    q, scale = quantize_weight(w)
    assert q.dtype == torch.int8
    torch.testing.assert_close(scale, torch.tensor([0.01, 100 / 127, 1e-12]))
    assert q[0].tolist() == [50, -127, 0] and q[1].tolist() == [127, 1, -64] and q[2].tolist() == [0, 0, 0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [True, False], ids=["weight_int8pack_mm", "dequantize"])
def test_both_kernels_compute_x_times_the_dequantized_weight(dtype, packed):
    """The CPU kernel and the fallback agree with x @ (q * scale).T in float64."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator)
    method = Int8Method(device=torch.device("cpu"), dtype=dtype)
    method.packed = packed
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
    method.process_weights_after_loading(layer)
    x = torch.randn(7, 64, generator=generator).to(dtype)
    dequantized = layer.weight.double() * layer.weight_scale.double()[:, None]
    expected = F.linear(x.double(), dequantized)
    out = method.apply(layer, x)
    assert out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, rtol=tolerance, atol=tolerance)


class TestInt8Float16(QuantizationMethodSuite):
    method_cls = Int8Method
    dtype = torch.float16
    max_relative_error = 0.03


def test_float16_products_do_not_overflow_on_outlier_activations():
    """In float16 the int8 values were multiplied by the activations before the scale: an outlier
    channel (here 600, against a weight of 1.0 there, 127 as int8) summed past float16's 65,504,
    and the default model under `--quantization int8 --dtype float16` answered with token 0 only."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 256, generator=gen) * 0.02
    weight[:, 7] = 1.0  # each row's largest weight: its scale is 1/127
    x = torch.randn(3, 256, generator=gen)
    x[:, 7] = 600.0
    method = Int8Method(device=torch.device("cpu"), dtype=torch.float16)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    method.process_weights_after_loading(layer)
    out = method.apply(layer, x.half())
    assert torch.isfinite(out).all()
    reference = x @ weight.T  # about 600 a row: well inside float16
    assert ((out.float() - reference).norm() / reference.norm()) < 0.01

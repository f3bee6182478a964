"""int4 against the quantization and packaging conformance suites, its rounding against GGUF
Q4_1 data of the real default model, and its kernels against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from minisgl_plugin_int4.method import (
    Int4HeadMethod,
    Int4Method,
    dequantize,
    pack_nibbles,
    packed_kernel_is_fast,
    quantize_weight,
    unpack_nibbles,
)

from minisgl_core.api import ParallelContext
from minisgl_core.layers.embedding import ParallelLMHead
from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.quantization_suite import QuantizationMethodSuite

needs_packed_kernel = pytest.mark.skipif(
    not packed_kernel_is_fast(), reason="no vectorized _weight_int4pack_mm_for_cpu on this CPU"
)


# 4 bits per group of 32: the suite's outlier columns widen their groups' ranges, so the rest of
# those groups round coarsely; worst measured 0.105 over the suite's layers (both kernels,
# float32 and bf16), about what 16 levels give on normal weights
class TestInt4Float32(QuantizationMethodSuite):
    method_cls = Int4Method
    max_relative_error = 0.12


class TestInt4Bfloat16(QuantizationMethodSuite):
    method_cls = Int4Method
    dtype = torch.bfloat16
    max_relative_error = 0.12


class TestInt4HeadFloat32(QuantizationMethodSuite):
    method_cls = Int4HeadMethod
    max_relative_error = 0.12


class TestInt4DequantizeFallback(QuantizationMethodSuite):
    """The path of GPUs and CPUs without a vectorized kernel, run here on the CPU."""

    method_cls = Int4Method
    max_relative_error = 0.12

    @pytest.fixture
    def method(self) -> Int4Method:
        method = Int4Method(device=torch.device("cpu"), dtype=self.dtype)
        method.packed = False
        return method


class TestInt4Packaging(PluginPackagingSuite):
    plugin = "int4"
    provides = {"quantization": ["int4", "int4-head"]}


def test_quantize_weight_maps_each_group_min_to_0_and_max_to_15():
    row = torch.arange(32, dtype=torch.float32) * 0.5 - 3.0  # one group: min -3, max 12.5
    constant = torch.full((32,), 0.25)
    q, scale, minimum = quantize_weight(torch.stack([row, constant]))
    torch.testing.assert_close(scale[:, 0], torch.tensor([15.5 / 15, 1e-12]))
    torch.testing.assert_close(minimum[:, 0], torch.tensor([-3.0, 0.25]))
    assert q[0, 0] == 0 and q[0, -1] == 15 and q[1].tolist() == [0] * 32
    # round to nearest: element i sits at 0.5 * i / (15.5 / 15) steps
    assert q[0].tolist() == torch.round(torch.arange(32) * 0.5 / (15.5 / 15)).int().tolist()
    with pytest.raises(ValueError, match="multiple of the group size 32"):
        quantize_weight(torch.zeros(4, 48))


def test_nibbles_pack_two_values_per_byte_and_come_back():
    q = torch.randint(0, 16, (5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = pack_nibbles(q)
    assert packed.shape == (5, 32) and packed.dtype == torch.uint8
    assert packed[0, 0] == q[0, 0] | (q[0, 1] << 4)
    assert torch.equal(unpack_nibbles(packed), q)


@pytest.fixture(scope="module")
def default_model_file():
    from pathlib import Path

    from minisgl_core.checkpoint.resolve import resolve_model

    [path] = Path(resolve_model(None)).glob("*.gguf")
    return path


def _q4_1_tensors(path) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """(name, q [rows, cols], d [rows, cols/32], m [rows, cols/32]) of every Q4_1 tensor of the
    file, decoded from the raw blocks (per block: f16 d, f16 m, 16 bytes: element j in the low
    nibble of byte j, element j + 16 in its high nibble)."""
    from gguf import GGMLQuantizationType, GGUFReader

    out = []
    for tensor in GGUFReader(path).tensors:
        if tensor.tensor_type != GGMLQuantizationType.Q4_1:
            continue
        cols = int(tensor.shape[0])  # GGUF lists the fastest-varying dimension first
        blocks = np.asarray(tensor.data, dtype=np.uint8).reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(-1, cols // 32)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32).reshape(-1, cols // 32)
        qs = blocks[:, 4:]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=1).reshape(-1, cols)
        out.append((tensor.name, q, d, m))
    return out


def test_requantizing_dequantized_q4_1_gives_back_the_files_q_scales_and_minimums(default_model_file):
    """Every Q4_1 tensor of the default model (30 blocks x 7 projections), dequantized as the
    GGUF reader does (d * q + m in float32), comes back to the file's q, minimums and scales bit
    for bit (the scale is (max - min) / 15 = (15 d) / 15, exact here): int4 is exact on them."""
    tensors = _q4_1_tensors(default_model_file)
    assert len(tensors) == 210
    for name, q, d, m in tensors:
        scale, minimum = torch.from_numpy(d), torch.from_numpy(m)
        weight = dequantize(torch.from_numpy(q), scale, minimum)
        q_back, scale_back, minimum_back = quantize_weight(weight)
        assert torch.equal(q_back, torch.from_numpy(q)), name
        assert torch.equal(minimum_back, minimum), name
        assert torch.equal(scale_back, scale), name


def _layer_with(weight: torch.Tensor, dtype: torch.dtype) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.to(dtype), requires_grad=False)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "packed", [pytest.param(True, marks=needs_packed_kernel), False], ids=["int4pack_mm", "dequantize"]
)
def test_both_kernels_compute_x_times_the_dequantized_weight(dtype, packed):
    """x @ (scale * q + minimum).T in float64, within bf16 rounding for the packed kernel (its
    activations, scales and output are bf16) and float32 rounding for the fallback."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=generator) * 0.05
    q, scale, minimum = quantize_weight(weight.to(dtype))
    method = Int4Method(device=torch.device("cpu"), dtype=dtype)
    method.packed = packed
    layer = _layer_with(weight, dtype)
    method.process_weights_after_loading(layer)
    assert layer.int4_kernel == ("int4pack_mm" if packed else "dequantize")
    x = torch.randn(7, 128, generator=generator).to(dtype)
    expected = F.linear(x.double(), dequantize(q, scale.double(), minimum.double()))
    out = method.apply(layer, x)
    assert out.shape == (7, 96) and out.dtype == dtype
    error = ((out.double() - expected).norm() / expected.norm()).item()
    # bf16 keeps 8 bits: a relative rounding of 2**-9 on each of x, the scales and the output
    assert error < (1e-2 if packed or dtype == torch.bfloat16 else 1e-6), error


@needs_packed_kernel
def test_layers_the_kernel_cannot_take_fall_back_and_say_so(caplog):
    method = Int4Method(device=torch.device("cpu"), dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    odd_rows = _layer_with(torch.randn(40, 64, generator=generator), torch.float32)  # 40 % 16 != 0
    odd_cols = _layer_with(torch.randn(32, 48, generator=generator), torch.float32)  # 48 % 32 != 0
    weight_odd_cols = odd_cols.weight.data.clone()
    for layer in (odd_rows, odd_cols):
        method.process_weights_after_loading(layer)
    assert (odd_rows.int4_kernel, odd_cols.int4_kernel) == ("dequantize", "unquantized")
    x = torch.randn(3, 48, generator=generator)
    assert torch.equal(method.apply(odd_cols, x), F.linear(x, weight_odd_cols))
    described = method.describe()
    assert described["layers"] == {"dequantize": 1, "unquantized": 1}
    assert "not a multiple of 32" in described["unquantized"]
    assert "quantizes nothing" not in caplog.text


def test_a_model_none_of_whose_layers_it_can_take_is_warned_about(caplog):
    """Every layer's in_features not a multiple of 32: int4 keeps them all in the run dtype, and
    says so as a warning (the load log's count is of the layers handed over, not quantized)."""
    method = Int4Method(device=torch.device("cpu"), dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    for cols in (48, 80):
        method.process_weights_after_loading(
            _layer_with(torch.randn(32, cols, generator=generator), torch.float32)
        )
    described = method.describe()
    assert described["layers"] == {"unquantized": 2}
    assert "--quantization int4 left all 2 layers it was handed in the run dtype" in caplog.text
    assert "quantizes nothing on this model" in caplog.text


@needs_packed_kernel
def test_lm_head_takes_two_int4_terms_and_is_far_closer_than_one():
    """int4-head's LM head: the weight and its residual, each int4; on a Q8_0-like table (what the
    default model's embedding is) the logits' error drops ~10x against one int4 term."""
    generator = torch.Generator().manual_seed(2)
    vocab, hidden = 512, 128
    table = torch.randn(vocab, hidden, generator=generator) * 0.05
    head = ParallelLMHead(vocab, hidden, parallel=ParallelContext(), dtype=torch.float32, device="cpu")
    head.weight.data.copy_(table)
    method = Int4HeadMethod(device=torch.device("cpu"), dtype=torch.float32)
    method.process_weights_after_loading(head)
    head.quant_method = method
    assert head.int4_kernel == "int4pack_mm x2"
    x = torch.randn(4, hidden, generator=generator)
    expected = x.double() @ table.double().T
    with torch.inference_mode():
        logits = head(x)
    two_terms = ((logits.double() - expected).norm() / expected.norm()).item()
    one_term = Int4Method(device=torch.device("cpu"), dtype=torch.float32)
    linear = _layer_with(table, torch.float32)
    one_term.process_weights_after_loading(linear)
    single = ((one_term.apply(linear, x).double() - expected).norm() / expected.norm()).item()
    assert two_terms < 0.01 < single and two_terms < single / 5, (two_terms, single)


def test_int4_leaves_the_lm_head_to_the_core_and_int4_head_takes_it():
    assert Int4Method.quantizes_lm_head is False and Int4HeadMethod.quantizes_lm_head is True

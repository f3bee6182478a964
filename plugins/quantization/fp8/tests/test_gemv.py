"""The one-token FP8 GEMV (:mod:`minisgl_plugin_fp8.gemv`) on the CPU under Triton's interpreter, in
a child process (``TRITON_INTERPRET`` must be set before Triton is imported): it equals the plugin's
emulation (``quantize_rows`` of the activations, both operands dequantized, the float32 product),
with and without split-K, and its in-kernel e4m3 rounding is torch's; the row quantizer kernel that
feeds ``torch._scaled_mm`` on CUDA gives ``quantize_rows``' bits; ``Fp8Method.apply`` sends one
token to the GEMV and more to ``torch._scaled_mm``. It also compiles for sm_90 (the interpreter does not
type-check). Speed is measured on a GPU: tools/device_fp8_check.py gemm."""

from __future__ import annotations

import sys

import pytest
import torch
from minisgl_plugin_fp8 import method as fp8_method

from minisgl_core.testing.triton_interpreter import (
    CheckOutputs,
    run_checks,
    run_checks_under_interpreter,
    run_under_interpreter,
)

pytest.importorskip("triton")

#: the kernel checks, which patch nothing the others use: one child runs them all (a child's
#: start-up, torch and Triton imported, costs about 3 s of CI); "apply" patches torch._scaled_mm
#: and the plugin's quantizer, so it keeps a child of its own
KERNEL_CHECKS = ["kernel", "round", "quantize"]


def run_child(*args: str) -> str:
    return run_under_interpreter(__file__, *args)


@pytest.fixture(scope="module")
def kernel_checks() -> CheckOutputs:
    return run_checks_under_interpreter(__file__, KERNEL_CHECKS)


def test_gemv_equals_the_float32_product(kernel_checks):
    out = kernel_checks["kernel"]
    assert out.count("ok") == len(SHAPES), out


def test_in_kernel_rounding_to_e4m3_is_torchs(kernel_checks):
    out = kernel_checks["round"]
    assert out.split() == ["ok"], out


def test_the_row_quantizer_kernel_gives_quantize_rows_bits(kernel_checks):
    out = kernel_checks["quantize"]
    assert out.split() == ["ok"] * len(QUANTIZE_SHAPES), out


def test_apply_takes_the_gemv_at_one_token_and_scaled_mm_beyond():
    out = run_child("apply")
    assert out.split() == ["gemv", "scaled_mm", "scaled_mm", "scaled_mm"], out


def test_with_compile_off_one_token_takes_scaled_mm_too():
    """The GEMV is a Triton kernel as well: with the compile switch off it had still run."""
    out = run_child("apply", "compile-off")
    assert out.split() == ["scaled_mm"] * 4, out


def test_the_choice_of_kernel():
    limit = fp8_method.GEMV_MAX_M
    assert fp8_method.gemv_applies(1, True) and fp8_method.gemv_applies(limit, True)
    assert not fp8_method.gemv_applies(limit + 1, True)
    assert not fp8_method.gemv_applies(0, True)  # an empty batch: no launch with an empty grid
    assert not fp8_method.gemv_applies(1, False)  # emulated layers keep the emulation


def test_the_activation_rounding_kernel_follows_the_compile_switch(monkeypatch):
    """``--disable-fast-path compile`` turns off the core's Triton kernels and this plugin's
    activation-rounding kernel alike (the plugin read ``MINISGL_COMPILE`` itself, so the flag, and
    a value such as ``false``, left its kernel on). CPU tensors are rounded eagerly whatever the
    switch."""
    import types

    from minisgl_plugin_fp8 import gemv

    from minisgl_core import fast_paths

    calls: list[str] = []
    monkeypatch.setattr(fp8_method, "quantize_rows", lambda x: calls.append("eager"))
    monkeypatch.setattr(gemv, "quantize_rows_triton", lambda x: calls.append("triton"))
    monkeypatch.delenv("MINISGL_COMPILE", raising=False)
    on_cuda = types.SimpleNamespace(is_cuda=True)  # all the switch reads of a CUDA tensor
    for configured, env, x in [
        (fast_paths.FastPaths(), None, on_cuda),
        (fast_paths.FastPaths().without("compile"), None, on_cuda),  # the flag
        (None, "false", on_cuda),  # not configured: the environment decides
        (None, None, on_cuda),
        (fast_paths.FastPaths(), None, torch.zeros(1, 4)),
    ]:
        monkeypatch.setattr(fast_paths, "_configured", configured)
        if env is None:
            monkeypatch.delenv("MINISGL_COMPILE", raising=False)
        else:
            monkeypatch.setenv("MINISGL_COMPILE", env)
        fp8_method.quantize_tokens(x)
    assert calls == ["triton", "eager", "eager", "triton", "eager"]


def test_split_k_only_when_the_rows_alone_leave_the_gpu_idle():
    from minisgl_plugin_fp8.gemv import MAX_SPLIT_K, PROGRAMS_PER_SM, pick_config

    # Llama-3.1-8B's shapes on 132 SMs, as swept on an H200 (weights from HBM): rows alone fill the
    # GPU (no split); 16 x 512 tiles for gate_up's many rows, 8 x 2,048 for o_proj's and
    # down_proj's few rows of a long K, 8 x 1,024 for qkv; the first block prefetched, evict-first,
    # 16 columns summed in each thread, the row rounded by the conversion instruction
    for n, k, tile, acc_r in ((6144, 4096, (8, 1024), 16), (4096, 4096, (8, 2048), 16),
                              (28672, 4096, (16, 512), 16), (4096, 14336, (8, 2048), 16)):  # fmt: skip
        config = pick_config(n, k)
        assert (config.block_n, config.block_k, config.split_k, config.acc_r) == (*tile, 1, acc_r), (
            n,
            k,
            config,
        )
        assert config.prefetch and config.evict and config.tiles == 1 and config.hw_round
    small = pick_config(512, 16384)  # 64 tiles of 8 rows: 8 splits wanted, 4 at most
    assert small.split_k == MAX_SPLIT_K and 64 * small.split_k < PROGRAMS_PER_SM * 132
    assert pick_config(2048, 8192).split_k == 2  # 256 tiles: 2 splits reach 2 programs per SM
    assert pick_config(512, 12288).split_k == 2  # 4 wanted, but each split keeps two 2,048-column steps
    assert pick_config(64, 1024).split_k == 1  # too short a K to split: one loop step each
    assert pick_config(64, 1024).block_k == 512 and pick_config(64, 8192).block_k == 2048
    assert pick_config(8192, 8192).block_k == 1024 and pick_config(16384, 2048).block_n == 16


def compile_gemv(config, constants: dict) -> str:
    """The PTX of the GEMV for sm_90 at ``config`` over a 4,096 x 4,096 weight, ``constants``
    overriding the config's own (``PDL`` also sets the launch option)."""
    from minisgl_plugin_fp8.gemv import fp8_gemv_kernel
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constants = {"K_PER_SPLIT": 4096 // config.split_k, "K_ROW": 4096, "SCALE_BLOCK": 4096,
                 "BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "TILES": config.tiles,
                 "PREFETCH": config.prefetch, "PDL": False, "ACC_R": config.acc_r, "EVICT": config.evict,
                 **constants}  # fmt: skip
    signature = {"x": "*bf16", "w": "*fp8e4nv", "w_scale": "*fp32", "out": "*bf16", "N": "i32", "K": "i32"}
    signature.update(dict.fromkeys(constants, "constexpr"))
    compiled = triton_compile(
        ASTSource(fp8_gemv_kernel, signature, constexprs=constants),
        target=GPUTarget("cuda", 90, 32),
        options={
            "num_warps": config.num_warps,
            "num_stages": config.num_stages,
            "launch_pdl": constants["PDL"],
        },
    )
    return compiled.asm["ptx"]


@pytest.mark.parametrize(
    "tiles, prefetch, pdl, variant",
    [
        (None, False, False, {}),
        (4, True, True, {}),
        (None, True, False, {"ACC_R": 4, "EVICT": False}),
        (None, True, False, {"HW_ROUND": True}),
    ],
)
def test_gemv_compiles_for_sm90(tiles, prefetch, pdl, variant):
    from minisgl_plugin_fp8.gemv import pick_config

    config = pick_config(4096, 4096)
    ptx = compile_gemv(config, {"TILES": tiles or config.tiles, "PREFETCH": prefetch, "PDL": pdl, **variant})
    # launched with programmatic dependent launch (MINISGL_PDL=1) it waits for the kernel before it,
    # then releases the kernel after it
    assert ("griddepcontrol.wait" in ptx) == pdl
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl
    assert "cvt.rn.f16x2.e4m3x2" in ptx  # the weight is read as fp8 and widened in registers
    assert "mma" not in ptx  # CUDA cores
    assert ("evict_first" in ptx) == variant.get("EVICT", config.evict)
    # the token's row rounded by the conversion instruction (round to nearest even), or in arithmetic
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == variant.get("HW_ROUND", False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_conversion_rounds_the_row_as_the_arithmetic_does():
    """On the GPU, ``hw_round`` (the row rounded to e4m3 by the conversion instruction) gives the
    bits of the arithmetic rounding (``_round_e4m3``, what the interpreter runs): the same kernel
    otherwise, so the same sums in the same order. The row holds ties between e4m3 neighbours at
    several binades and subnormals (its largest entry 448 makes the scale exactly 1), then random
    rows of Llama-3.1-8B's four widths."""
    from minisgl_plugin_fp8.gemv import fp8_gemv, pick_config
    from minisgl_plugin_fp8.method import quantize_rows

    gen = torch.Generator(device="cuda").manual_seed(0)
    ties = torch.tensor([448.0, 100.0, -3.125, 0.65625, 11.5, -0.0068359375, 0.0029296875, 232.0])
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        q, scale = quantize_rows(torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02)
        rows = [torch.randn(1, k, generator=gen, device="cuda").to(torch.bfloat16) * 3]
        crafted = torch.randn(1, k, generator=gen, device="cuda") * 0.01
        crafted[0, : len(ties) * 64] = ties.repeat(64)
        rows.append(crafted.to(torch.bfloat16))
        config = pick_config(n, k)
        for x in rows:
            hardware = fp8_gemv(x, q, scale, config._replace(hw_round=True))
            arithmetic = fp8_gemv(x, q, scale, config._replace(hw_round=False))
            assert torch.equal(hardware, arithmetic), (
                n,
                k,
                (hardware.float() - arithmetic.float()).abs().max(),
            )


def test_row_quantizer_compiles_for_sm90():
    from minisgl_plugin_fp8.gemv import quantize_rows_kernel
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x": "*bf16", "x_row_stride": "i32", "q": "*fp8e4nv", "scales": "*fp32", "K": "i32",
                 "K_ROW": "constexpr", "BLOCK": "constexpr"}  # fmt: skip
    compiled = triton_compile(
        ASTSource(quantize_rows_kernel, signature, constexprs={"K_ROW": 16384, "BLOCK": 4096}),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )
    ptx = compiled.asm["ptx"]
    assert "div.rn.f32" in ptx  # the IEEE reciprocal, as torch.reciprocal


# ---------------------------------------------------------------- the child process

#: (weight rows, weight columns, split_k or None for pick_config's): row counts not a multiple of
#: the tile, columns a multiple of 16 but not of the K step
SHAPES = [  # rows, cols, split_k, tiles per program (None: pick_config's), prefetch, and
    # GemvConfig's acc_r (in-thread sums over that many columns) and evict
    (40, 208, None, None, False, 1, False),
    (24, 1024, 2, None, True, 1, False),
    (72, 512, None, 4, True, 1, False),  # 72 rows in 8-row tiles, 4 a program: the last runs out
    (33, 4096, 4, 2, False, 1, False),
    (40, 2048, None, None, True, 1, False),
    (16, 300, None, 2, True, 1, False),  # one step per split: the prefetched block is the only one
    (40, 208, None, None, False, 4, True),
    (33, 4096, 4, 2, False, 16, False),
    (72, 2048, 2, 4, True, 8, True),
    (16, 300, None, 2, True, 4, False),
]


def check_kernel() -> None:
    from minisgl_plugin_fp8.gemv import fp8_gemv, pick_config
    from minisgl_plugin_fp8.method import quantize_rows

    gen = torch.Generator().manual_seed(0)
    for rows, cols, split_k, tiles, prefetch, acc_r, evict in SHAPES:
        q, scale = quantize_rows(torch.randn(rows, cols, generator=gen))
        config = pick_config(rows, cols)
        if split_k:
            config = config._replace(split_k=split_k)
        if tiles:
            config = config._replace(tiles=tiles)
        config = config._replace(prefetch=prefetch, acc_r=acc_r, evict=evict)
        x = torch.randn(1, cols + 16, generator=gen)[:, :cols]  # a view into a wider row
        for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
            xd = x.to(dtype)
            xq, x_scale = quantize_rows(xd)
            weight = (q.float() * scale).T
            expected = (xq.float() * x_scale) @ weight
            out = fp8_gemv(xd, q, scale.view(1, rows), config)
            assert out.dtype == dtype and out.shape == (1, rows)
            # float32: summation order only; bf16: the output's rounding (2**-8 relative)
            torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
            # and the activations really were rounded to e4m3 (3.6% relative), not used as they are
            unrounded = xd.float() @ weight
            assert (out.float() - unrounded).norm() > 0.01 * unrounded.norm()
        print("ok", rows, cols, config.split_k)


#: (rows, columns, dtype): one pass and two passes over a row (4,096 columns per pass), a row
#: of zeros, a row with outliers, a view into wider rows
QUANTIZE_SHAPES = [
    (5, 208, torch.float32),
    (3, 4096, torch.bfloat16),
    (4, 9000, torch.bfloat16),
    (6, 640, torch.float16),
]


def check_quantize() -> None:
    from minisgl_plugin_fp8.gemv import quantize_rows_triton
    from minisgl_plugin_fp8.method import quantize_rows

    gen = torch.Generator().manual_seed(2)
    for rows, cols, dtype in QUANTIZE_SHAPES:
        x = torch.randn(rows, cols + 8, generator=gen)[:, :cols] * 3
        x[0] = 0.0
        x[1, :4] *= 40
        x = x.to(dtype)
        q, scale = quantize_rows_triton(x)
        q_ref, scale_ref = quantize_rows(x)
        assert q.dtype == torch.float8_e4m3fn and scale.shape == (rows, 1)
        assert torch.equal(scale, scale_ref), (scale, scale_ref)
        # the same values (a tiny negative may come out +0.0 here and -0.0 in torch: no product differs)
        assert torch.equal(q.float(), q_ref.float())
        print("ok")


def check_round() -> None:
    """``_round_e4m3`` against torch's float32 -> float8_e4m3fn on random values of every binade,
    exact ties (100 lies between 96 and 104: even is 96), subnormals and binade edges."""
    import triton
    import triton.language as tl
    from minisgl_plugin_fp8 import gemv

    globals()["_round_e4m3"] = gemv._round_e4m3  # a jitted kernel finds helpers among its globals

    @triton.jit
    def kernel(x, out, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(out + i, _round_e4m3(tl.load(x + i)))  # noqa: F821

    gen = torch.Generator().manual_seed(0)
    grid = torch.arange(-(2**14), 2**14, dtype=torch.float32) / 2**14  # fine steps, both signs
    values = torch.cat([
        (torch.randn(8192, generator=gen) * torch.exp2(torch.randint(-12, 9, (8192,), generator=gen).float())),
        grid * 448, grid * 2**-6, torch.tensor([100.0, -100.0, 31.6, 0.0, 448.0, -448.0, 2**-10, 3 * 2**-10]),
    ]).clamp(-448, 448)  # fmt: skip
    values = torch.cat([values, torch.zeros(triton.next_power_of_2(values.numel()) - values.numel())])
    out = torch.empty_like(values)
    kernel[(1,)](values, out, N=values.numel())
    torch.testing.assert_close(out, values.to(torch.float8_e4m3fn).float(), rtol=0, atol=0)
    print("ok")


def check_apply() -> None:
    """``apply`` on a layer marked native (as on a Hopper GPU) with ``torch._scaled_mm`` and the
    activation quantizer replaced by recorders: which token counts reach which kernel."""
    from minisgl_plugin_fp8.method import GEMV_MAX_M, Fp8Method, quantize_rows

    method = Fp8Method(device=torch.device("cpu"), dtype=torch.float32)
    layer = torch.nn.Module()
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    method.process_weights_after_loading(layer)
    layer.fp8_native = True  # what a CUDA device of compute capability >= 8.9 would have set
    calls: list[str] = []

    def fake_scaled_mm(a, b, **kwargs):
        calls.append("scaled_mm")
        return torch.zeros(a.shape[0], b.shape[1])

    fp8_method.quantize_tokens = quantize_rows
    torch._scaled_mm = fake_scaled_mm
    # (CPU tensors under the interpreter stand for CUDA ones here; "compile-off" says what
    # --disable-fast-path compile does: the one token to _scaled_mm as well)
    compile_on = sys.argv[2:] != ["compile-off"]
    fp8_method.compiled_kernels = lambda x: compile_on
    for tokens in (GEMV_MAX_M, GEMV_MAX_M + 1, 7, 64):
        x = torch.randn(tokens, 64)
        calls.clear()
        out = method.apply(layer, x.view(1, tokens, 64))
        assert out.shape == (1, tokens, 48)
        if calls:
            print(calls[0])
        else:
            xq, x_scale = quantize_rows(x)  # the GEMV rounds the activations as _scaled_mm's path does
            expected = (xq.float() * x_scale) @ (layer.weight.float() * layer.weight_scale.view(-1, 1)).T
            torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-5)
            print("gemv")


if __name__ == "__main__":
    if sys.argv[1] == "checks":  # e.g. ``checks kernel,round``
        run_checks({"kernel": check_kernel, "round": check_round, "quantize": check_quantize}, sys.argv[2])
    else:
        check_apply()

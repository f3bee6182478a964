"""The decode kernels compile for sm_90 (bf16 and float8 pools) and sm_80 (bf16; Triton has no
e4m3 there) on any machine (the interpreter does not type-check): over a float8 pool the values
are widened to float16 in registers and the products run on tensor cores. Their numbers are checked by the conformance suite (test_triton_suite.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")


def compile_decode(arch: int, kv: str, widen: bool, splits: int) -> str:
    from minisgl_plugin_triton.kernels import decode_kernel
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"q_ptr": "*bf16", "k_ptr": f"*{kv}", "v_ptr": f"*{kv}", "page_table_ptr": "*i32",
                 "req_slots_ptr": "*i32", "seq_lens_ptr": "*i32", "order_ptr": "*i32", "out_ptr": "*bf16", "part_ptr": "*fp32",
                 "lse_ptr": "*fp32", "scale_log2": "fp32", "q_stride_token": "i32", "q_stride_head": "i32",
                 "kv_stride_slot": "i32", "page_table_stride": "i32", "out_stride_token": "i32",
                 "out_stride_head": "i32"}  # fmt: skip
    constants = {"NUM_HEADS": 16, "GROUP": 2, "BLOCK_H": 16, "HEAD_DIM": 128, "BLOCK_N": 64,
                 "NUM_SPLITS": splits, "WIDEN_FP8": widen, "DOT_FP32": False}  # fmt: skip
    signature.update(dict.fromkeys(constants, "constexpr"))
    compiled = triton_compile(
        ASTSource(decode_kernel, signature, constexprs=constants),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": 4, "num_stages": 2},
    )
    return compiled.asm["ptx"]


def test_fp8_pool_is_widened_to_fp16_and_multiplied_on_tensor_cores():
    ptx = compile_decode(90, "fp8e4nv", widen=True, splits=1)
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert "mma.sync" in ptx and ".f16.f16" in ptx


@pytest.mark.parametrize("arch", [90, 80])
def test_bf16_pool_with_splits(arch):
    ptx = compile_decode(arch, "bf16", widen=False, splits=8)
    assert "mma.sync" in ptx and ".bf16.bf16" in ptx
    assert "e4m3" not in ptx


def test_merge_kernel_compiles():
    from minisgl_plugin_triton.kernels import merge_kernel
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": "*bf16", "out_stride_token": "i32",
                 "out_stride_head": "i32", "NUM_HEADS": "constexpr", "HEAD_DIM": "constexpr",
                 "NUM_SPLITS": "constexpr"}  # fmt: skip
    compiled = triton_compile(
        ASTSource(merge_kernel, signature, constexprs={"NUM_HEADS": 16, "HEAD_DIM": 128, "NUM_SPLITS": 32}),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )
    assert "ex2.approx" in compiled.asm["ptx"]

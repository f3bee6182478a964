"""The kernels compile for sm_90 (bf16 and float8 pools) and sm_80 (bf16; Triton has no e4m3
there) on any machine (the interpreter does not type-check): over a float8 pool the values are
widened to float16 in registers and the products run on tensor cores; in bf16 the exact P·V adds
a second product. Their numbers are checked by the conformance suite (test_triton_suite.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

ATTEND = {
    "q_ptr": "*bf16",
    "k_ptr": "*bf16",
    "v_ptr": "*bf16",
    "page_table_ptr": "*i32",
    "req_slots_ptr": "*i32",
}
STRIDES = {"scale_log2": "fp32", "q_stride_token": "i32", "q_stride_head": "i32", "kv_stride_slot": "i32",
           "page_table_stride": "i32"}  # fmt: skip
#: the decode kernel's non-constant arguments over a bf16 pool
DECODE = {**ATTEND, "seq_lens_ptr": "*i32", "order_ptr": "*i32", "skip_ptr": "*i32", "out_ptr": "*bf16",
          "part_ptr": "*fp32", "lse_ptr": "*fp32", **STRIDES, "out_stride_token": "i32",
          "out_stride_head": "i32"}  # fmt: skip


def compile_kernel(kernel, signature: dict, constants: dict, arch: int = 90, options: dict | None = None,
                   aligned: tuple[str, ...] = ()):  # fmt: skip
    """``kernel`` compiled for sm_``arch`` (Triton's compiled kernel: ``.asm["ptx"]``, ``["cubin"]``);
    ``aligned`` names the arguments a real launch passes 16-divisible (Triton's ``tt.divisibility``
    hint, which changes the loads it emits: ``cp.async`` pipelines among them)."""
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton_compile(
        ASTSource(kernel, signature, constexprs=constants, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=options or {"num_warps": 4, "num_stages": 2},
    )


def compile_ptx(kernel, signature: dict, constants: dict, arch: int = 90) -> str:
    return compile_kernel(kernel, signature, constants, arch).asm["ptx"]


def compile_decode(
    arch: int, kv: str, widen: bool, splits: int, cascade: bool = False, exact: bool = False, window: int = 0
) -> str:
    from minisgl_plugin_triton.kernels import decode_kernel

    signature = {**DECODE, "k_ptr": f"*{kv}", "v_ptr": f"*{kv}"}
    constants = {"NUM_HEADS": 16, "GROUP": 2, "BLOCK_H": 16, "HEAD_DIM": 128, "BLOCK_N": 64,
                 "NUM_SPLITS": splits, "ENTRIES": splits + (2 if cascade else 0), "CASCADE": cascade,
                 "WIDEN_FP8": widen, "DOT_FP32": False, "EXACT_PV": exact, "WINDOW": window}  # fmt: skip
    return compile_ptx(decode_kernel, signature, constants, arch)


@pytest.mark.parametrize(
    ("arch", "kv", "widen"), [(90, "bf16", False), (90, "fp8e4nv", True), (80, "bf16", False)]
)
def test_a_windowed_layer_compiles_and_starts_later(arch: int, kv: str, widen: bool) -> None:
    """(API 2.7) ``WINDOW`` (a sliding window's layer): the same kernel with one more subtraction
    and maximum before the loop (its numbers: the suite's ``test_sliding_window``)."""
    plain = compile_decode(arch, kv, widen, splits=4)
    windowed = compile_decode(arch, kv, widen, splits=4, window=4093)
    assert windowed != plain and "4093" in windowed and "4093" not in plain


def test_fp8_pool_is_widened_to_fp16_and_multiplied_on_tensor_cores():
    ptx = compile_decode(90, "fp8e4nv", widen=True, splits=1)
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert "mma.sync" in ptx and ".f16.f16" in ptx


@pytest.mark.parametrize("arch", [90, 80])
def test_bf16_pool_with_splits(arch):
    ptx = compile_decode(arch, "bf16", widen=False, splits=8)
    assert "mma.sync" in ptx and ".bf16.bf16" in ptx
    assert "e4m3" not in ptx


def test_exact_pv_is_a_second_tensor_core_product():
    plain = compile_decode(90, "bf16", widen=False, splits=1).count("mma.sync")
    exact = compile_decode(90, "bf16", widen=False, splits=1, exact=True).count("mma.sync")
    assert plain > 0 and exact > plain


def test_cascade_decode_and_prefix_kernels_compile():
    from minisgl_plugin_triton.kernels import prefix_kernel

    assert "mma.sync" in compile_decode(90, "bf16", widen=False, splits=4, cascade=True, exact=True)
    signature = {**ATTEND, "tasks_ptr": "*i32", "part_ptr": "*fp32", "lse_ptr": "*fp32", **STRIDES,
                 "tasks_stride": "i32"}  # fmt: skip
    for kv, widen in (("bf16", False), ("fp8e4nv", True)):
        constants = {"NUM_HEADS": 16, "GROUP": 2, "BLOCK_M": 16, "HEAD_DIM": 128, "BLOCK_N": 64, "NUM_SPLITS": 1,
                     "PREFIX_SPLITS": 2, "WIDEN_FP8": widen, "DOT_FP32": False, "EXACT_PV": not widen}  # fmt: skip
        ptx = compile_ptx(prefix_kernel, {**signature, "k_ptr": f"*{kv}", "v_ptr": f"*{kv}"}, constants)
        assert "mma.sync" in ptx and "st.local" not in ptx  # tensor cores, no register spills


@pytest.mark.parametrize("cascade", [False, True])
def test_merge_kernel_compiles(cascade):
    from minisgl_plugin_triton.kernels import merge_kernel

    signature = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "skip_ptr": "*i32", "out_ptr": "*bf16",
                 "out_stride_token": "i32", "out_stride_head": "i32"}  # fmt: skip
    constants = {"NUM_HEADS": 16, "HEAD_DIM": 128, "ENTRIES": 6 if cascade else 32, "OWN_ENTRIES": 4 if cascade else 32,
                 "ENTRIES_P2": 8 if cascade else 32, "CASCADE": cascade}  # fmt: skip
    assert "ex2.approx" in compile_ptx(merge_kernel, signature, constants)


def test_pdl_variants_wait_then_release():
    """``MINISGL_PDL=1`` (``triton_ops.pdl_options``): the decode and merge kernels (and the prefix
    kernel, the same lines) wait for the kernel before them (``griddepcontrol.wait``, before
    reading its output), then release the kernel after them; compiled without it, neither."""
    from minisgl_plugin_triton.kernels import decode_kernel, merge_kernel

    signature = {"part_ptr": "*fp32", "lse_ptr": "*fp32", "skip_ptr": "*i32", "out_ptr": "*bf16",
                 "out_stride_token": "i32", "out_stride_head": "i32"}  # fmt: skip
    constants = {"NUM_HEADS": 16, "HEAD_DIM": 128, "ENTRIES": 32, "OWN_ENTRIES": 32, "ENTRIES_P2": 32,
                 "CASCADE": False}  # fmt: skip
    decode = compile_decode(90, "bf16", widen=False, splits=4)
    assert "griddepcontrol" not in decode
    assert "griddepcontrol" not in compile_ptx(merge_kernel, signature, constants)
    merge = compile_ptx(merge_kernel, signature, {**constants, "PDL": True})
    assert merge.index("griddepcontrol.wait") < merge.index("griddepcontrol.launch_dependents")
    constants = {"NUM_HEADS": 16, "GROUP": 2, "BLOCK_H": 16, "HEAD_DIM": 128, "BLOCK_N": 64, "NUM_SPLITS": 4,
                 "ENTRIES": 4, "CASCADE": False, "WIDEN_FP8": False, "DOT_FP32": False, "EXACT_PV": False,
                 "PDL": True}  # fmt: skip
    decode = compile_ptx(decode_kernel, DECODE, constants)
    assert decode.index("griddepcontrol.wait") < decode.index("griddepcontrol.launch_dependents")


def test_early_variant_prefetches_kv_before_its_wait():
    """``EARLY`` with PDL (fast path ``pdl_attention``): the first blocks of K and V are prefetched
    into L2 before ``griddepcontrol.wait`` (the point of launching early), one prefetch per
    128-byte line, nothing loaded into registers from the pool; without ``EARLY`` the PDL variant
    waits before its first global access."""
    from minisgl_plugin_triton.kernels import decode_kernel

    constants = {"NUM_HEADS": 16, "GROUP": 2, "BLOCK_H": 16, "HEAD_DIM": 128, "BLOCK_N": 64, "NUM_SPLITS": 1,
                 "ENTRIES": 1, "CASCADE": False, "WIDEN_FP8": False, "DOT_FP32": False, "EXACT_PV": False,
                 "PDL": True}  # fmt: skip
    early = compile_ptx(
        decode_kernel, DECODE, {**constants, "EARLY": True, "EARLY_BLOCKS": 1, "EARLY_LINE": 64}
    )
    wait = early.index("griddepcontrol.wait")
    # 64 positions x 2 lines of 128 bytes, for K and for V, over 128 threads
    assert early.count("prefetch.global.L2", 0, wait) == 2 * 64 * 2 // 128
    assert "prefetch.global.L2" not in early[wait:]
    assert "mma.sync" in early and early.index("griddepcontrol.launch_dependents") > wait
    assert "st.local" not in early
    plain = compile_ptx(decode_kernel, DECODE, constants)
    assert "ld.global" not in plain[: plain.index("griddepcontrol.wait")] and "prefetch" not in plain


@pytest.mark.parametrize("head_dim, line", [(32, 32), (64, 64), (256, 64)])
def test_early_variant_compiles_for_any_head_row(head_dim, line):
    """A head's row shorter than a 128-byte line (head_dim 32 or 64 in bf16) is one prefetch a
    row (the backend's ``EARLY_LINE``); a longer one, one a line."""
    from minisgl_plugin_triton.kernels import decode_kernel

    constants = {"NUM_HEADS": 8, "GROUP": 4, "BLOCK_H": 16, "HEAD_DIM": head_dim, "BLOCK_N": 64, "NUM_SPLITS": 2,
                 "ENTRIES": 2, "CASCADE": False, "WIDEN_FP8": False, "DOT_FP32": False, "EXACT_PV": False,
                 "PDL": True, "EARLY": True, "EARLY_BLOCKS": 1, "EARLY_LINE": line}  # fmt: skip
    ptx = compile_ptx(decode_kernel, DECODE, constants)
    assert "prefetch.global.L2" in ptx[: ptx.index("griddepcontrol.wait")]


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers, stack and local bytes a thread of a kernel, from ``cuobjdump -res-usage``
    (Triton's own): ptxas puts spilled registers in the stack frame."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip("Triton's cuobjdump is not installed")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run(
            [str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    return {k: int(v) for k, v in re.findall(r"(REG|LOCAL|STACK):(\d+)", out)}


def _decode_usage(launch, group: int = 2, splits: int = 1, kv: str = "fp8e4nv") -> dict[str, int]:
    """Registers and stack of the float8 (or ``kv``) decode kernel under ``launch`` (sm_90, the
    launch's divisibility hints)."""
    from minisgl_plugin_triton.kernels import decode_kernel

    widen = kv == "fp8e4nv"
    signature = {**DECODE, "k_ptr": f"*{kv}", "v_ptr": f"*{kv}"}
    constants = {"NUM_HEADS": 8 * group, "GROUP": group, "BLOCK_H": 16, "HEAD_DIM": 128, "BLOCK_N": launch.block_n,
                 "NUM_SPLITS": splits, "ENTRIES": splits, "CASCADE": False, "WIDEN_FP8": widen, "DOT_FP32": False,
                 "EXACT_PV": False}  # fmt: skip
    aligned = (*(n for n in signature if signature[n].startswith("*")), "kv_stride_slot", "q_stride_token")
    compiled = compile_kernel(decode_kernel, signature, constants, options=launch.options(interpreted=False),
                              aligned=aligned)  # fmt: skip
    return _resource_usage(compiled.asm["cubin"])


@pytest.mark.parametrize("block_n, stages, cap", [(128, 3, 168), (64, 3, 128), (32, 3, 96)])
def test_a_register_cap_holds_without_spills_over_a_float8_pool(block_n, stages, cap):
    """``Launch.maxnreg``: the float8 kernel (194 registers a thread uncapped at 128 positions on
    sm_90, two programs an SM) compiles under these caps with nothing spilled (no stack frame),
    so an SM holds three, four or five programs (``tools/device_triton_decode.py --occupancy``
    times them; a cap of 128 at 128 positions spills 112 bytes a thread)."""
    from minisgl_plugin_triton.backend import Launch

    launch = Launch(block_n, 4, stages, cap)
    assert launch.options(interpreted=False)["maxnreg"] == cap
    assert "maxnreg" not in launch.options(interpreted=True)
    usage = _decode_usage(launch)
    assert usage["REG"] <= cap and usage["STACK"] == 0 and usage["LOCAL"] == 0, usage


@pytest.mark.parametrize("group", [2, 4])
def test_the_float8_launch_fits_three_programs_an_sm(group):
    """The backend's float8 launch: at most 170 registers a thread (65,536 / (3 x 128 threads))
    with nothing spilled, at the full batch's one split, Qwen3's and Llama's GQA groups; uncapped
    it took 194 (two programs an SM), and the cap took a layer's decode from 211 to 176 us at
    batch 256 on an H200 (BENCHMARKS.md)."""
    from minisgl_plugin_triton.backend import TritonDecodeBackend

    launch = TritonDecodeBackend.launches[1]
    usage = _decode_usage(launch, group=group)
    assert usage["REG"] * 32 * launch.num_warps * 3 <= 65536, usage
    assert usage["STACK"] == 0 and usage["LOCAL"] == 0, usage


@pytest.mark.parametrize("splits", [1, 4])
def test_the_wide_bf16_launch_spills_nothing(splits):
    """The bf16 launch of small batches (``wide_launches``: 128 positions a loop step) keeps every
    value in registers, unsplit and split, and an SM still holds two programs or more."""
    from minisgl_plugin_triton.backend import TritonDecodeBackend

    launch = TritonDecodeBackend.wide_launches[2]
    assert launch.block_n == 128
    usage = _decode_usage(launch, splits=splits, kv="bf16")
    assert usage["STACK"] == 0 and usage["LOCAL"] == 0, usage
    assert usage["REG"] * 32 * launch.num_warps * 2 <= 65536, usage

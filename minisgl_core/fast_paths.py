"""The switches of the fast paths (all but two on the GPU), in one frozen object, and the one place that reads their
environment variables.

Every path is on by default; turning one off is an ablation (BENCHMARKS.md measures each). The
command line sets them (``--disable-fast-path NAME``, repeatable) into ``EngineConfig.fast_paths``,
which every process receives; the environment variables below are documented overrides (read
through :mod:`minisgl_core.environment`), when a config is built without the flag.

A process applies its config with :func:`configure` (the model runner does, before it builds the
model); the kernels ask :func:`current`. Until a process configures, :func:`current` reads the
environment on each call, so tests and tools that set a variable at run time still work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from minisgl_core import environment


@dataclass(frozen=True)
class FastPaths:
    #: torch.compile of the fused elementwise ops (RMSNorm + residual, rotary, SiLU·mul); off also
    #: turns off the hand-written Triton kernels below
    compile: bool = True
    #: one Triton kernel for q/k norm, rotary and the K/V store (backends with "prestored_kv")
    fused_kv: bool = True
    #: that kernel as masked tiles of 2-4 tokens a program (off: one token a program)
    rope_store_tiles: bool = True
    #: Hopper+: the Triton decode attention kernel launched with programmatic dependent launch
    #: after that kernel, its first KV blocks prefetched into L2 while that kernel runs
    pdl_attention: bool = True
    #: the Triton SiLU·mul kernel
    triton_silu: bool = True
    #: the Triton RMS norm (and residual add + RMS norm) kernels, in place of the compiled ones
    triton_norm: bool = True
    #: the sampler's Gumbel-max draw in Triton (two kernels: the chunks' sums, then the race)
    triton_sampler: bool = True
    #: a Triton GEMM for linear layers of at most 64 rows where cuBLAS is slow (narrow weights of
    #: small models, the lm_head): decode steps of small batches
    triton_small_gemm: bool = True
    #: on one GPU, that GEMM's split-K partial sums (o_proj, down_proj) added by the RMS norm after
    #: it, with the residual add, instead of by a kernel of their own
    split_k_norm: bool = True
    #: mixture-of-experts blocks (Qwen3-MoE): the experts as two Triton grouped GEMMs over tokens
    #: sorted by expert (off: a loop over the experts, which reads their token counts on the host
    #: and so cannot be captured into a CUDA graph)
    triton_moe: bool = True
    #: those blocks' router (softmax, top-k, renormalization, rounding) as one Triton kernel
    #: instead of five torch kernels
    moe_route: bool = True
    #: those blocks' schedule (pairs grouped by expert) as one program for steps of up to 2,048
    #: (token, choice) pairs instead of three kernels and a zeroed count
    moe_one_program: bool = True
    #: on one GPU, each token's top-k expert rows added by the RMS norm after the block, with the
    #: residual add, instead of summed by a kernel of their own
    moe_sum_in_norm: bool = True
    #: one-shot symmetric-memory all-reduce for decode-sized sums under tensor parallelism
    symm_mem: bool = True
    #: its wide path for sums from 768 KiB: copy, barrier, a Triton sum over every peer's buffer
    symm_mem_wide: bool = True
    #: the all-reduce after o_proj and down_proj fused with the residual add and RMS norm that
    #: follow it (two shared buffers in turn, one barrier)
    symm_mem_norm: bool = True
    #: that fused kernel passes the buffers' barrier itself (a flag per program in the signal pads)
    #: instead of after PyTorch's barrier kernel
    symm_mem_norm_barrier: bool = True
    #: tensor parallelism: each rank samples its own slice of the vocabulary and the ranks trade
    #: one (value, token) pair per row, instead of gathering every rank's logits
    vocab_parallel_sampling: bool = True
    #: CPU (AMD under MKL, where it was measured to pay): float32 linear layers of 1-4 rows (the
    #: lm_head up to 32) as one batched product over slabs of the weight's rows, which reads it at
    #: the memory's speed where ``F.linear`` does not
    cpu_slab_gemm: bool = True
    #: CPU (the same processors): float32 linear layers of more rows (the lm_head from 5) through
    #: oneDNN's linear instead of MKL's ``F.linear``, which is slow there at every row count
    cpu_onednn_gemm: bool = True

    def __post_init__(self) -> None:
        # ("no" was taken for true, as any non-empty string is)
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, bool):
                raise TypeError(f"FastPaths field {f.name} must be true or false, got {value!r}")

    def without(self, *names: str) -> FastPaths:
        """These switches turned off (names as in :data:`NAMES`)."""
        unknown = sorted(set(names) - set(NAMES))
        if unknown:
            raise ValueError(f"unknown fast path(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
        return replace(self, **{name: False for name in names})

    def enabled(self, name: str) -> bool:
        """Whether ``name`` is on; every Triton kernel also needs ``compile``."""
        if (
            name
            in (
                "fused_kv",
                "rope_store_tiles",
                "pdl_attention",
                "triton_silu",
                "triton_norm",
                "triton_sampler",
                "triton_small_gemm",
                "split_k_norm",
                "triton_moe",
                "moe_route",
                "moe_one_program",
                "moe_sum_in_norm",
            )
            and not self.compile
        ):
            return False
        return bool(getattr(self, name))


NAMES: tuple[str, ...] = tuple(f.name for f in fields(FastPaths))

#: the documented environment overrides: ``VARIABLE=0`` turns the path off
ENV_VARS: dict[str, str] = {
    "compile": "MINISGL_COMPILE",
    "fused_kv": "MINISGL_FUSED_KV",
    "rope_store_tiles": "MINISGL_ROPE_STORE_TILES",
    "pdl_attention": "MINISGL_PDL_ATTENTION",
    "triton_silu": "MINISGL_TRITON_SILU",
    "triton_norm": "MINISGL_TRITON_NORM",
    "triton_sampler": "MINISGL_TRITON_SAMPLER",
    "triton_small_gemm": "MINISGL_TRITON_SMALL_GEMM",
    "split_k_norm": "MINISGL_SPLIT_K_NORM",
    "triton_moe": "MINISGL_TRITON_MOE",
    "moe_route": "MINISGL_MOE_ROUTE",
    "moe_one_program": "MINISGL_MOE_ONE_PROGRAM",
    "moe_sum_in_norm": "MINISGL_MOE_SUM_IN_NORM",
    "symm_mem": "MINISGL_SYMM_MEM",
    "symm_mem_wide": "MINISGL_SYMM_MEM_WIDE",
    "symm_mem_norm": "MINISGL_SYMM_MEM_NORM",
    "symm_mem_norm_barrier": "MINISGL_SYMM_MEM_NORM_BARRIER",
    "vocab_parallel_sampling": "MINISGL_VOCAB_PARALLEL_SAMPLING",
    "cpu_slab_gemm": "MINISGL_CPU_SLAB_GEMM",
    "cpu_onednn_gemm": "MINISGL_CPU_ONEDNN_GEMM",
}


def from_env(environ: Mapping[str, str] | None = None) -> FastPaths:
    """The switches the environment asks for (all on unless a variable is ``0``)."""
    get = environment.get if environ is None else environ.get
    return FastPaths(
        **{name: environment.parse_switch(var, get(var), True) for name, var in ENV_VARS.items()}
    )


_configured: FastPaths | None = None


def configure(fast_paths: FastPaths) -> None:
    """Make ``fast_paths`` this process's switches (the model runner calls it at start)."""
    global _configured
    _configured = fast_paths


def current() -> FastPaths:
    """This process's switches: the configured ones, else the environment's."""
    return _configured if _configured is not None else from_env()

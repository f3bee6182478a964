"""Every environment variable minisgl reads, and the one place it reads them.

A behaviour switch is a field of a frozen config with a command-line flag (``EngineConfig``,
``FastPaths``, ``ServerLimits``...); a variable here only supplies the default of such a flag, or
a location or secret that has no better home. Product code reads them through :func:`get` (a
test keeps ``os.environ`` reads out of every other module), so this table is the whole list; the
README repeats it for users.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

#: name -> what it does (the flag or field it is the default of)
DOCUMENTED: dict[str, str] = {
    "MINISGL_COMPILE": "0 turns off the compiled fused ops and every Triton kernel (--disable-fast-path compile)",
    "MINISGL_FUSED_KV": "0 turns off the fused q/k norm + rotary + KV store kernel (--disable-fast-path fused_kv)",
    "MINISGL_ROPE_STORE_TILES": "0 runs that kernel one token a program instead of in tiles of 2-4 tokens "
    "(--disable-fast-path rope_store_tiles)",
    "MINISGL_PDL_ATTENTION": "0 launches the Triton decode attention kernel plainly instead of with programmatic "
    "dependent launch, its first KV blocks prefetched while the kernel before it runs (--disable-fast-path pdl_attention)",
    "MINISGL_TRITON_SILU": "0 turns off the Triton SiLU·mul kernel (--disable-fast-path triton_silu)",
    "MINISGL_TRITON_NORM": "0 turns off the Triton RMS norm kernels (--disable-fast-path triton_norm)",
    "MINISGL_TRITON_SAMPLER": "0 turns off the Triton Gumbel-max draw (--disable-fast-path triton_sampler)",
    "MINISGL_TRITON_SMALL_GEMM": "0 turns off the Triton GEMM of linear layers at up to 64 rows "
    "(--disable-fast-path triton_small_gemm)",
    "MINISGL_SPLIT_K_NORM": "0 gives that GEMM's split-K partial sums a kernel of their own instead of adding "
    "them in the RMS norm after it (--disable-fast-path split_k_norm)",
    "MINISGL_TRITON_MOE": "0 runs mixture-of-experts blocks as a loop over the experts instead of the Triton "
    "grouped GEMMs (eager only: it cannot be captured into CUDA graphs; --disable-fast-path triton_moe)",
    "MINISGL_MOE_ROUTE": "0 runs a mixture-of-experts router as five torch kernels instead of one Triton kernel "
    "(--disable-fast-path moe_route)",
    "MINISGL_MOE_ONE_PROGRAM": "0 builds the experts' schedule with three kernels at every step instead of one "
    "program at steps of up to 2,048 (token, choice) pairs (--disable-fast-path moe_one_program)",
    "MINISGL_MOE_SUM_IN_NORM": "0 sums each token's top-k expert rows with a kernel of its own instead of in the "
    "RMS norm after the block (--disable-fast-path moe_sum_in_norm)",
    "MINISGL_SYMM_MEM": "0 turns off the symmetric-memory all-reduce (--disable-fast-path symm_mem)",
    "MINISGL_SYMM_MEM_WIDE": "0 turns off its wide path for sums from 768 KiB (--disable-fast-path symm_mem_wide)",
    "MINISGL_SYMM_MEM_NORM": "0 turns off its sum fused with the residual add and RMS norm after it (--disable-fast-path symm_mem_norm)",
    "MINISGL_SYMM_MEM_NORM_BARRIER": "0 makes that fused kernel wait behind PyTorch's barrier kernel instead of "
    "passing the barrier itself (--disable-fast-path symm_mem_norm_barrier)",
    "MINISGL_PDL": "1 launches the hand-written Triton kernels with programmatic dependent launch everywhere "
    "(Hopper+), 0 nowhere; unset, only in the decode CUDA graphs of up to 8 sequences on one GPU, where it "
    "shortens a step (everywhere it cost Qwen3-0.6B 1% offline; BENCHMARKS.md)",
    "MINISGL_SPLIT_MIXED": "0 runs a mixed step's decode rows on the prefill attention backend with its "
    "prompt rows; by default (1 on a GPU, 0 elsewhere) they run on the decode backend: on an H200 "
    "1.10x the throughput of unsplit mixed steps on Llama-3.1-8B, ITL p99 20 vs 121 ms",
    "MINISGL_VOCAB_PARALLEL_SAMPLING": "0 gathers every rank's logits before sampling under TP "
    "(--disable-fast-path vocab_parallel_sampling)",
    "MINISGL_CPU_SLAB_GEMM": "0 runs float32 linear layers of a few rows on an AMD CPU through F.linear instead of "
    "one batched product over slabs of the weight (--disable-fast-path cpu_slab_gemm)",
    "MINISGL_CPU_ONEDNN_GEMM": "0 runs float32 linear layers of more rows on an AMD CPU through F.linear (MKL) instead "
    "of oneDNN's linear (--disable-fast-path cpu_onednn_gemm)",
    "MINISGL_STEP_TRACE": "FILE: the default of --step-trace (EngineConfig.step_trace), one JSON line per step",
    "MINISGL_LOG_LEVEL": "the default of --log-level",
    "MINISGL_API_KEY": "the default of --api-key for serve, shell --url and bench serve (preferred: a flag shows in the process list)",
    "MINISGL_PLUGINS": "comma-separated allow-list of plugins ('' = none); no flag: plugins are "
    "discovered before any flag is parsed, since they add flags",
    "MINISGL_DISABLE_PLUGINS": "comma-separated plugins to skip, added to --disable-plugin",
    "MINISGL_CACHE_DIR": "where the default model and the demo model are kept (default ~/.cache/minisgl)",
    "MINISGL_COMMIT": "the commit bench results record, for a checkout whose .git is elsewhere",
    "TRITON_INTERPRET": "Triton's own: 1 runs the Triton kernels on the CPU under its interpreter (tests)",
}


def get(name: str, default: str | None = None) -> str | None:
    """The variable's value, or ``default`` when it is unset; only documented names."""
    if name not in DOCUMENTED:
        raise KeyError(f"{name} is not a documented minisgl environment variable (minisgl_core.environment)")
    return os.environ.get(name, default)


def forget(name: str) -> None:
    """Remove the variable from this process's environment, so the processes it starts do not
    inherit it (the API key: only the API server checks it)."""
    if name not in DOCUMENTED:
        raise KeyError(f"{name} is not a documented minisgl environment variable (minisgl_core.environment)")
    os.environ.pop(name, None)


#: spellings of an on/off variable (any case)
#: spellings of an on/off variable (any case); unset or empty is the variable's default
_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})
_warned: set[str] = set()


def parse_switch(name: str, value: str | None, default: bool) -> bool:
    """``name=value`` as on/off: ``1`` (true, on, yes) or ``0`` (false, off, no), any case; unset
    or empty, ``default``; anything else is logged once and leaves ``default`` (MINISGL_PDL=true
    meant off). The one reading of every switch: :func:`switch` and the fast paths'."""
    spelled = (value or "").strip().lower()
    if not spelled:
        return default
    if spelled in _TRUE or spelled in _FALSE:
        return spelled in _TRUE
    if name not in _warned:
        _warned.add(name)
        logging.getLogger(__name__).warning(
            "%s=%r is neither 0 nor 1: it stays %s", name, value, "on" if default else "off"
        )
    return default


def switch(name: str, default: bool) -> bool:
    """The on/off variable ``name`` (:func:`parse_switch`)."""
    return parse_switch(name, get(name), default)


def split_list(value: str | None) -> list[str] | None:
    """A comma-separated list; None stays None (unset), ``""`` is the empty list."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


class CacheDirError(RuntimeError):
    """The cache directory cannot be used; the message names the variable and the path."""


def cache_dir() -> Path:
    """Where downloaded and built models are kept: ``$MINISGL_CACHE_DIR``, else ~/.cache/minisgl.
    One that exists and is no directory, or that cannot be looked up, is a :class:`CacheDirError`
    (a traceback from the first ``mkdir`` inside it before)."""
    path = Path(get("MINISGL_CACHE_DIR") or Path.home() / ".cache" / "minisgl")
    try:
        not_a_directory = path.exists() and not path.is_dir()
    except OSError as exc:  # (a name too long: ENAMETOOLONG, a traceback from every command)
        raise CacheDirError(
            _cache_dir_message(path, f"cannot be looked up ({exc.strerror or exc})")
        ) from None
    if not_a_directory:
        raise CacheDirError(_cache_dir_message(path, "is not a directory"))
    return path


def cache_dir_error(exc: OSError) -> CacheDirError | None:
    """``exc`` as a :class:`CacheDirError` when the path it failed on lies in the cache directory
    (a directory that cannot be created or written to), else None: for the command line to say
    in one line what a library caller gets as the ``OSError`` itself."""
    failed = exc.filename if isinstance(exc.filename, str) else None
    try:
        root = cache_dir()
    except CacheDirError as error:
        return error
    if failed is None or not Path(os.path.abspath(failed)).is_relative_to(os.path.abspath(root)):
        return None
    return CacheDirError(_cache_dir_message(root, f"cannot write to it ({failed}: {exc.strerror or exc})"))


def _cache_dir_message(path: Path, problem: str) -> str:
    where = (
        f"MINISGL_CACHE_DIR={path}"
        if get("MINISGL_CACHE_DIR")
        else f"the cache directory {path} (MINISGL_CACHE_DIR unset)"
    )
    return f"{where}: {problem}; point MINISGL_CACHE_DIR at a directory you can write to"


def triton_interpreter() -> bool:
    """Whether Triton runs its kernels under the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return get("TRITON_INTERPRET") == "1"

"""Engine settings shared by the offline API, the server and the benchmarks."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import torch

from minisgl_core import environment, fast_paths
from minisgl_core.fast_paths import FastPaths

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: ``--kv-cache-dtype``: None = the run dtype
KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn}

#: the default page size on CUDA: FlashInfer's decode reads 16-token pages ~5% faster than
#: single-token ones (H200, Qwen3-0.6B offline +2.7%, BENCHMARKS.md); the prefix cache then
#: shares whole pages only
CUDA_PAGE_SIZE = 16

#: the KV pool's largest size on a CPU when num_kv_tokens is unset (a GPU's is sized from free
#: memory): the runner sizes it to what the run can use (max_running_requests x max_context_len)
#: within :data:`CPU_KV_MEMORY_SHARE` of the free memory, see ``ModelRunner._cpu_kv_tokens``
CPU_DEFAULT_KV_TOKENS = 65536
#: the share of a CPU's free memory (once the weights are in) the default KV pool may take: a
#: fixed 65,536 tokens asked 14 GiB for Qwen3-0.6B in float32, past what many machines have free
CPU_KV_MEMORY_SHARE = 0.5
#: ... or up to this share, where that holds one request of max_context_len and the other does not
CPU_KV_MEMORY_MOST = 0.8

#: most threads the grammar backend may fill bitmasks with (``--grammar-threads``): a fill splits
#: one step's constrained rows (at most ``max_running_requests``) among them, and past the CPUs
#: of any host we serve from more threads only add switching
MAX_GRAMMAR_THREADS = 64
#: the longest n-gram the ngram drafter may match (it keeps an index per size and request) and the
#: most draft tokens a step may verify per request: far above what pays (2-5 and 4-8), far below
#: what exhausts memory (10**8 did)
MAX_SPECULATIVE_NGRAM = 64
MAX_SPECULATIVE_DRAFT_TOKENS = 64
#: speculative decoding's tuning settings: only with ``speculative_algorithm`` (else ignored, so refused)
SPECULATIVE_TUNING = ("speculative_num_draft_tokens", "speculative_ngram_max", "speculative_ngram_min")


class ConfigError(ValueError):
    """A setting the engine refuses at start-up. The message names the settings by their field
    names (``page_size``), listed in ``fields`` too, so that the command line can say the flag
    instead (``--page-size``, see :func:`minisgl_core.config_args.cli_message`)."""

    def __init__(self, message: str, *fields: str) -> None:
        super().__init__(message)
        self.fields = fields


@dataclass(frozen=True)
class EngineConfig:
    model: str
    #: attention backend; "a,b" = a for prefill, b for decode; "auto" picks by device
    attn: str = "auto"
    cache: str = "radix"
    policy: str = "prefill-first"
    #: tokens per KV page; None = :data:`CUDA_PAGE_SIZE` on CUDA when the attention backends
    #: support pages of several tokens, else 1 (see ``ModelRunner``)
    page_size: int | None = None
    #: most new tokens in one prefill step (longer prompts are prefilled in chunks)
    max_prefill_tokens: int = 8192
    max_running_requests: int = 256
    #: None = the model's max_position_embeddings
    max_context_len: int | None = None
    #: KV pool size in tokens; None = sized from free memory (GPU), or on a CPU to what the run
    #: can use, at most 65,536 and half the free memory (see CPU_DEFAULT_KV_TOKENS)
    num_kv_tokens: int | None = None
    #: share of the free GPU memory (after loading weights, less 4 GiB for activations and CUDA
    #: graphs) given to the KV pool; unused on a CPU and with ``num_kv_tokens`` set
    kv_memory_fraction: float = 0.85
    dtype: str = "auto"
    device: str = "auto"
    tp_size: int = 1
    seed: int = 0
    #: largest decode batch captured in a CUDA graph; 0 disables graphs
    cuda_graph_max_bs: int = 256
    #: prefill and mixed steps of at most this many tokens replay piecewise CUDA graphs
    #: (everything but attention; runner/piecewise.py); 0, or ``cuda_graph_max_bs`` 0, disables them.
    #: 8192 (a full default prefill chunk) since 2026-11-27: +0.2 to +7.1% (mean +4.1%) offline on
    #: an H200 in six pairs against 2048, whose 8,192-token steps spent 12-14 ms of host time
    #: launching their eager forward (BENCHMARKS.md)
    piecewise_cuda_graph_max_tokens: int = 8192
    #: overlap CPU scheduling of step N+1 with the GPU running step N
    overlap: bool = True
    #: cascade attention for decode requests sharing a cached prefix, where the decode backend
    #: supports it (read the shared prefix once per group)
    cascade: bool = True
    #: mixed steps: chunked prefill rides along with the running decodes (each decode one token,
    #: counted against ``max_prefill_tokens``), where the prefill backend declares "mixed".
    #: None: on a CPU only. On the GPU they made every latency worse at equal throughput while
    #: prefill steps ran eagerly; with the piecewise prefill graphs two served runs disagree
    #: (BENCHMARKS.md, "Piecewise CUDA graphs"); on the CPU they are better (a decode row costs
    #: about what a prefill token does there).
    mixed_batch: bool | None = None
    #: where requests' unset sampling fields get their defaults: "auto" (the model's
    #: generation_config.json), "vllm"/"none" (SamplingParams' own), or a folder holding a
    #: generation_config.json (see checkpoint/generation_defaults.py)
    generation_config: str = "auto"
    #: grammar-backend plugin for constrained decoding (response_format, structured_outputs)
    grammar_backend: str = "xgrammar"
    #: threads the grammar backend fills a step's token bitmasks with (``--grammar-threads``);
    #: 1 to :data:`MAX_GRAMMAR_THREADS`; None = ``minisgl_core.api.default_fill_threads()`` (half the
    #: CPUs, 1 to 16)
    grammar_threads: int | None = None
    #: seconds a server's request waits for its grammar to compile (off the scheduler's thread)
    #: before it fails with an HTTP 400 (``--grammar-compile-timeout``); None = no limit
    grammar_compile_timeout: float | None = 60.0
    #: weight quantization of the linear layers: a method registered through
    #: minisgl_register_quantization_methods (fp8, int8, ...); None = weights in the run dtype
    quantization: str | None = None
    #: KV pool dtype: "auto" = the run dtype; "fp8_e4m3" = float8_e4m3fn, scale 1.0 (values are
    #: cast on store and dequantized on read; the attention backend must declare "kv_fp8")
    kv_cache_dtype: str = "auto"
    #: speculative decoding: None (off) or "ngram" (prompt lookup); verify steps run without
    #: overlap scheduling, as decode batches in the decode CUDA graphs (see engine/speculative.py)
    speculative_algorithm: str | None = None
    #: most draft tokens per request per step
    speculative_num_draft_tokens: int = 4
    #: n-gram sizes the ngram drafter looks up, longest first
    speculative_ngram_max: int = 4
    speculative_ngram_min: int = 1
    #: options plugins added to the CLI, passed through untouched
    plugin_options: dict[str, Any] = field(default_factory=dict)
    #: the GPU fast paths' switches (ablations); default: the environment's overrides, else all on
    fast_paths: FastPaths = field(default_factory=fast_paths.from_env)
    #: a file the engine of rank 0 appends one JSON line per step to (``--step-trace``); default:
    #: ``$MINISGL_STEP_TRACE``, else none
    step_trace: str | None = field(default_factory=lambda: environment.get("MINISGL_STEP_TRACE") or None)

    def __post_init__(self) -> None:
        if self.plugin_options is None:  # (no options, as the command line passes none)
            object.__setattr__(self, "plugin_options", {})
        self._check_types()
        if self.page_size is not None and (self.page_size < 1 or self.page_size & (self.page_size - 1)):
            raise ConfigError(f"page_size must be a power of two >= 1, got {self.page_size}", "page_size")
        for name in ("max_prefill_tokens", "max_running_requests", "tp_size", "speculative_num_draft_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", name)
        check_grammar_threads(self.grammar_threads)
        timeout = self.grammar_compile_timeout
        if timeout is not None and not (0 < timeout < float("inf")):
            raise ConfigError(
                f"grammar_compile_timeout must be a number of seconds > 0, got {timeout}",
                "grammar_compile_timeout",
            )
        if (
            self.max_context_len is not None and self.max_context_len < 2
        ):  # (1 started, then refused every request)
            raise ConfigError(
                f"max_context_len must be >= 2 (a one-token prompt and one output token), or unset, "
                f"got {self.max_context_len}",
                "max_context_len",
            )
        if self.num_kv_tokens is not None and self.num_kv_tokens < 1:
            raise ConfigError(
                f"num_kv_tokens must be >= 1 (or unset), got {self.num_kv_tokens}", "num_kv_tokens"
            )
        if self.num_kv_tokens is not None and self.num_kv_tokens < 2 * (self.page_size or 1):
            raise ConfigError(
                f"num_kv_tokens must hold two pages at least (2 x page_size {self.page_size or 1}), "
                f"got {self.num_kv_tokens}",
                "num_kv_tokens",
                "page_size",
            )
        if self.cuda_graph_max_bs < 0:
            raise ConfigError(
                f"cuda_graph_max_bs must be >= 0 (0 disables CUDA graphs), got {self.cuda_graph_max_bs}",
                "cuda_graph_max_bs",
            )
        if self.piecewise_cuda_graph_max_tokens < 0:
            raise ConfigError(
                "piecewise_cuda_graph_max_tokens must be >= 0 (0 disables piecewise prefill graphs), "
                f"got {self.piecewise_cuda_graph_max_tokens}",
                "piecewise_cuda_graph_max_tokens",
            )
        if self.quantization is not None and not (
            isinstance(self.quantization, str) and self.quantization.strip()
        ):
            # ("" ran unquantized without a word, as if the name had been read)
            raise ConfigError(
                f"quantization must name a method (such as int8 or fp8), or be unset for weights in the "
                f"run dtype; got {self.quantization!r}",
                "quantization",
            )
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {self.dtype!r}", "dtype")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}",
                "kv_cache_dtype",
            )
        if not 0 < self.kv_memory_fraction <= 1:
            raise ConfigError(
                f"kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}", "kv_memory_fraction"
            )
        if self.speculative_algorithm not in (None, "ngram"):
            raise ConfigError(
                f"speculative_algorithm must be ngram or unset, got {self.speculative_algorithm!r}",
                "speculative_algorithm",
            )
        if self.speculative_ngram_max > MAX_SPECULATIVE_NGRAM:  # each size keeps an index per request
            raise ConfigError(
                f"speculative_ngram_max must be at most {MAX_SPECULATIVE_NGRAM}, got {self.speculative_ngram_max}",
                "speculative_ngram_max",
            )
        if self.speculative_num_draft_tokens > MAX_SPECULATIVE_DRAFT_TOKENS:
            raise ConfigError(
                f"speculative_num_draft_tokens must be at most {MAX_SPECULATIVE_DRAFT_TOKENS}, "
                f"got {self.speculative_num_draft_tokens}",
                "speculative_num_draft_tokens",
            )
        if not (-(2**63) <= self.seed < 2**64):  # what torch.manual_seed takes
            raise ConfigError(f"seed must be an integer in [-2**63, 2**64-1], got {self.seed}", "seed")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ConfigError(
                "speculative n-gram sizes must satisfy 1 <= speculative_ngram_min <= speculative_ngram_max, "
                f"got {self.speculative_ngram_min} and {self.speculative_ngram_max}",
                "speculative_ngram_min",
                "speculative_ngram_max",
            )
        if self.step_trace:  # a path the engine cannot append to failed once the model had loaded
            problem = _cannot_append(Path(self.step_trace))
            if problem is not None:
                raise ConfigError(
                    f"step_trace {self.step_trace!r}: {problem}"
                    " (a file to append one JSON line per step to; env MINISGL_STEP_TRACE)",
                    "step_trace",
                )
        attention_names(self.attn)
        # ("cpu:1" was taken, the index ignored, while this message named no such form)
        if self.device != "auto" and (
            _device_type(self.device) not in ("cpu", "cuda") or self.device.startswith("cpu:")
        ):
            raise ConfigError(f"device must be auto, cpu, cuda or cuda:N; got {self.device!r}", "device")

    #: what each simple annotation takes (bool is not an int here, nor a float)
    _KINDS: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {
        "int": ((int,), "an integer"),
        "float": ((int, float), "a number"),
        "str": ((str,), "a string"),
        "bool": ((bool,), "true or false"),
    }

    def _check_types(self) -> None:
        """A value of the wrong type (``LLM(page_size="16")``, ``attn=None``, ``overlap="no"``)
        failed deep in the engine with a comparison or a torch error, or passed for what it was not;
        here it names the field. Each field of a simple annotation (``int``, ``float | None``...) is
        checked by it, so a field added later is too."""
        if not isinstance(self.model, (str, os.PathLike)):
            raise ConfigError(f"model must be a path or a name, got {self.model!r}", "model")
        # (None was a TypeError from LLM, and a string's characters were taken for option names)
        if not isinstance(self.plugin_options, Mapping):
            raise ConfigError(
                "plugin_options must be a dict of plugin options by name (or unset), got "
                f"{self.plugin_options!r}",
                "plugin_options",
            )
        # (a dict failed in the first kernel that asked for a switch)
        if not isinstance(self.fast_paths, FastPaths):
            raise ConfigError(
                "fast_paths must be a minisgl_core.fast_paths.FastPaths, e.g. "
                f"FastPaths().without('compile'); got {type(self.fast_paths).__name__}",
                "fast_paths",
            )
        for f in fields(self):
            kind, _, optional = str(f.type).partition(" | ")
            if kind not in self._KINDS or optional not in ("", "None"):
                continue  # (model, plugin options, fast paths: their own checks)
            value = getattr(self, f.name)
            if value is None and optional:
                continue
            types, says = self._KINDS[kind]
            if f.name == "step_trace":  # (a file: a path object too)
                types = (str, os.PathLike)
            if not isinstance(value, types) or (kind != "bool" and isinstance(value, bool)):
                raise ConfigError(
                    f"{f.name} must be {says}{' (or unset)' if optional else ''}, got {value!r}", f.name
                )

    def context_len(self, hf_config: dict[str, Any]) -> int:
        """The longest request the engine runs: ``max_context_len`` capped by the model's
        max_position_embeddings (4096 where its config.json names none)."""
        max_pos = int(hf_config.get("max_position_embeddings", 4096))
        return min(self.max_context_len or max_pos, max_pos)

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device {self.device} was asked for but CUDA is not available here; use device cpu", "device"
            )
        return device

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def resolve_kv_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The KV pool's dtype for a run in ``dtype``."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype] or dtype


def check_page_size(page_size: int, context_len: int, kv_tokens: int | None) -> None:
    """A KV page holds tokens of one request: one longer than the context is never filled, and the
    pool needs two pages at least (one is kept for CUDA-graph padding). ``kv_tokens`` None: the
    pool is not sized yet (a GPU's, from free memory)."""
    limit = context_len if kv_tokens is None else min(context_len, kv_tokens // 2)
    if page_size <= limit or limit < 1:  # (a pool without room for two 1-token pages: its own error)
        return
    fit = 1 << (limit.bit_length() - 1)  # the largest power of two that fits
    if page_size > context_len:
        raise ConfigError(
            f"page_size {page_size} is larger than the context length {context_len}, so no request "
            f"ever fills a page; use a page_size of at most {fit}",
            "page_size",
        )
    raise ConfigError(
        f"page_size {page_size} leaves the KV pool ({kv_tokens} tokens) fewer than the two pages it "
        f"needs; use a page_size of at most {fit}, or a larger num_kv_tokens",
        "page_size",
        "num_kv_tokens",
    )


def _cannot_append(path: Path) -> str | None:
    """Why the engine could not open ``path`` to append its step trace to (None: it can), tried
    as it will open it: a file it may not write, or a kernel interface's (/proc's), was a worker's
    traceback once the model had loaded. An existing file is opened for appending (nothing is
    written), a missing one tried as a temporary file in its folder; anything else (a FIFO, whose
    reader would take the probe's close for the end) is left as it is. A name the file system will
    not look up (too long: ENAMETOOLONG, which pathlib's ``is_dir`` raises) cannot be opened either."""
    try:
        if path.is_dir():
            return "is a directory"
        if not path.parent.is_dir():
            return "its directory does not exist"
        if not path.exists():
            tempfile.TemporaryFile(dir=path.parent).close()
        elif path.is_file():
            with open(path, "a"):
                pass
    except OSError as exc:
        return f"cannot be opened for appending: {exc.strerror or exc}"
    return None


def _device_type(device: str) -> str | None:
    try:
        return torch.device(device).type
    except RuntimeError:  # not a device string at all
        return None


#: ``attn="auto"`` on CUDA: the first usable backend of each list, by role; a CPU, or a GPU without
#: them: :data:`AUTO_FALLBACK`
AUTO_PREFILL = ("fa3", "fi")
AUTO_DECODE = ("triton", "fi")
AUTO_FALLBACK = "torch"


def auto_attention(cuda: bool, usable: Callable[[str], bool]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``attn="auto"``'s backends by role, (prefill, decode), each in order of preference: on
    CUDA those of :data:`AUTO_PREFILL` and :data:`AUTO_DECODE` that ``usable`` accepts, or
    :data:`AUTO_FALLBACK` alone for a role it accepts none of; on a CPU the fallback for both.

    The one choice for the two that make it, so they cannot drift: the model runner takes the
    first of each (the next decode ones where the first refuses the model), its ``usable`` asking
    each backend whether it runs on its device with the capabilities it needs; the launcher checks
    every name, its ``usable`` knowing only what is installed (it starts no CUDA)."""
    if not cuda:
        return (AUTO_FALLBACK,), (AUTO_FALLBACK,)
    prefill, decode = (
        tuple(filter(usable, names)) or (AUTO_FALLBACK,) for names in (AUTO_PREFILL, AUTO_DECODE)
    )
    return prefill, decode


def attention_names(attn: str) -> tuple[str, ...]:
    """The attention backends ``attn`` names: one, or PREFILL,DECODE; none for "auto" (the
    runner picks by device). A ``ConfigError`` naming the field for any other shape."""
    if attn == "auto":
        return ()
    names = tuple(name.strip() for name in attn.split(","))
    # (auto in a pair was an unknown backend 'auto': "pip install minisgl-plugin-auto"; AUTO in
    # one was too, with "did you mean 'auto'?", as a name in another case is, for a pair that
    # refuses auto)
    in_pair = len(names) == 2 and any(name.casefold() == "auto" for name in names)
    if len(names) not in (1, 2) or not all(names) or in_pair:
        alone = ": auto picks both backends, so it stands alone" if in_pair else ""
        raise ConfigError(f"attn takes NAME, PREFILL,DECODE or auto; got {attn!r}{alone}", "attn")
    return names


def check_grammar_threads(threads: int | None) -> None:
    """``grammar_threads``: None (the default, half the CPUs, 1 to 16) or 1 to :data:`MAX_GRAMMAR_THREADS`."""
    if threads is not None and not 1 <= threads <= MAX_GRAMMAR_THREADS:
        raise ConfigError(
            f"grammar_threads must be in [1, {MAX_GRAMMAR_THREADS}] (unset: half the CPUs, 1 to 16), "
            f"got {threads}",
            "grammar_threads",
        )


def check_api_key(key: str | None) -> None:
    """A key a client can send in an ``Authorization`` header: printable ASCII without surrounding
    spaces. A server started with "abc " (HTTP drops the trailing space) or "clé" (the header is
    read as Latin-1) refused every request with a 401; a client's was a UnicodeEncodeError."""
    if key is None or not key.strip():
        return
    if key != key.strip():
        raise ConfigError(
            "--api-key (or MINISGL_API_KEY) has spaces around it, which HTTP drops: remove them"
        )
    bad = next((c for c in key if not " " <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(
            f"--api-key (or MINISGL_API_KEY) holds {bad!r}, which an HTTP header cannot carry: use "
            "printable ASCII characters only"
        )

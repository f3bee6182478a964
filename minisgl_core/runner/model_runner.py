"""ModelRunner: loads the model of one TP rank, owns the KV pool and page table, runs forward passes."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

import torch

from minisgl_core import environment, fast_paths
from minisgl_core.api import (
    AttentionBackend,
    AttentionConfig,
    ForwardBatch,
    KVCache,
    KVSpec,
    ModelConfig,
    ParallelContext,
    SharedPrefix,
)
from minisgl_core.checkpoint.buildable import model_config, unbuildable_message
from minisgl_core.checkpoint.formats import ModelPathError, SafetensorsFormat, open_model
from minisgl_core.checkpoint.integrity import check_config_values
from minisgl_core.config import (
    AUTO_DECODE,
    AUTO_FALLBACK,
    AUTO_PREFILL,
    CPU_DEFAULT_KV_TOKENS,
    CPU_KV_MEMORY_MOST,
    CPU_KV_MEMORY_SHARE,
    CUDA_PAGE_SIZE,
    ConfigError,
    EngineConfig,
    attention_names,
    auto_attention,
    check_page_size,
)
from minisgl_core.layers import ParallelLMHead
from minisgl_core.layers.triton_ops import ROPE_STORE_WIDE_FROM
from minisgl_core.plugins import NotRunnableHere, PluginError, Plugins, checkout_plugin
from minisgl_core.runner import quantization
from minisgl_core.runner.layout import set_layout
from minisgl_core.runner.memory_check import MemoryAsk, check_fits, free_bytes, refusing_failed_allocation
from minisgl_core.runner.split_mixed import SplitMixedAttention, leading_decode_rows
from minisgl_core.sampling import short_repr
from minisgl_core.setting_names import Spelling, given, named

logger = logging.getLogger(__name__)


def pick_attention(
    spec: str, device: torch.device, plugins: Plugins, needs: frozenset[str] = frozenset()
) -> tuple[str, str]:
    """Parse ``--attn``: "name", "prefill,decode" or "auto" (:func:`auto_attention`: torch on CPU;
    on a GPU the first usable of :data:`AUTO_PREFILL` and of :data:`AUTO_DECODE` declaring the
    capabilities in ``needs``, e.g. "kv_fp8" for a float8 pool: fa3 prefill + triton decode on Hopper)."""
    if spec != "auto":
        names = [s.strip() for s in spec.split(",")]
        if len(names) not in (1, 2) or not all(names):
            raise ValueError(f"--attn takes NAME or PREFILL,DECODE; got {spec!r}")
        return names[0], names[-1]
    cuda = device.type == "cuda"
    picked = auto_attention(cuda, lambda name: is_usable(name, device, plugins, needs))
    for role, names, candidates in zip(("prefill", "decode"), (AUTO_PREFILL, AUTO_DECODE), picked):
        if cuda and candidates == (AUTO_FALLBACK,):  # slow, and easy to miss in a result: say why
            why = "; ".join(f"{n}: {unusable_reason(n, device, plugins, needs)}" for n in names)
            logger.warning(
                "--attn auto found no GPU %s backend usable here (%s); %s runs on torch", role, why, role
            )
    return picked[0][0], picked[1][0]


def unusable_reason(
    name: str, device: torch.device, plugins: Plugins, needs: frozenset[str] = frozenset()
) -> str:
    """Why attention backend ``name`` is not :func:`is_usable` (one phrase)."""
    if name not in plugins.registry["attention"]:
        source = checkout_plugin("attention", name)  # (a package no index has was named)
        return f"not installed (pip install -e {source})" if source else "not installed"
    cls = plugins.resolve("attention", name)
    reason = cls.availability(device)
    if reason is not None:
        return reason
    missing = sorted(needs - cls.capabilities)
    return f"does not declare {', '.join(missing)}" if missing else "usable"


def decode_fallbacks(
    spec: str, decode: str, device: torch.device, plugins: Plugins, needs: frozenset[str] = frozenset()
) -> list[str]:
    """Under ``--attn auto``, the usable decode backends after ``decode`` in :data:`AUTO_DECODE`:
    what to try when ``decode`` refuses the model. Empty for an explicit ``--attn``."""
    if spec != "auto":
        return []
    _, usable = auto_attention(device.type == "cuda", lambda name: is_usable(name, device, plugins, needs))
    return list(usable[usable.index(decode) + 1 :]) if decode in usable else []


def is_usable(name: str, device: torch.device, plugins: Plugins, needs: frozenset[str] = frozenset()) -> bool:
    """Attention backend ``name`` is installed, available on ``device`` and declares ``needs``."""
    if name not in plugins.registry["attention"]:
        return False
    cls = plugins.resolve("attention", name)
    return cls.availability(device) is None and needs <= cls.capabilities


def resolve_page_size(
    page_size: int | None,
    device: torch.device,
    backends: dict[str, type[AttentionBackend]],
    spelling: Spelling = "flag",
) -> int:
    """``page_size`` checked against the attention backends, or the default when None (``spelling``:
    how the refusal names the setting, ``--page-size`` or ``page_size=``)."""
    single = sorted(name for name, cls in backends.items() if "page_size>1" not in cls.capabilities)
    if page_size is None:
        return CUDA_PAGE_SIZE if device.type == "cuda" and not single else 1
    if page_size > 1 and single:
        raise NotRunnableHere(
            f"attention backend {single[0]!r} supports only {given('page_size', 1, spelling)} (it does not "
            'declare "page_size>1")'
        )
    return page_size


def check_roles(
    prefill: str,
    decode: str,
    backends: dict[str, type[AttentionBackend]],
    plugins: Plugins,
    device: torch.device,
    spelling: Spelling = "flag",
    needs: frozenset[str] = frozenset(),
) -> None:
    """The prefill backend declares "prefill" and the decode backend "decode" (a backend may
    implement one of the two: ``--attn fi,triton``); the refusal suggests a partner usable here."""
    for role, name in (("prefill", prefill), ("decode", decode)):
        if role not in backends[name].capabilities:
            other = "decode" if role == "prefill" else "prefill"
            partner = role_partner(role, device, plugins, needs)
            if partner is None:
                fix = f"beside a backend that runs {role} steps (none installed runs them on {device})"
            else:
                pair = f"{partner},{name}" if role == "prefill" else f"{name},{partner}"
                fix = f"e.g. {given('attn', pair, spelling)}"
            raise NotRunnableHere(
                f"attention backend {name!r} does not run {role} steps (it does not declare {role!r}); "
                f"use it for {other} only, {fix}"
            )


def role_partner(
    role: str, device: torch.device, plugins: Plugins, needs: frozenset[str] = frozenset()
) -> str | None:
    """The backend to suggest for ``role`` steps beside one that does not run them: the first
    usable on ``device`` of what ``--attn auto`` prefers for the role, then of the rest installed
    (the hint said fi on every device, which a CPU cannot run). None: no backend here runs them."""
    preferred = AUTO_PREFILL if role == "prefill" else AUTO_DECODE
    for name in dict.fromkeys([*preferred, AUTO_FALLBACK, *plugins.names("attention")]):
        try:
            if is_usable(name, device, plugins, needs | {role}):
                return name
        except PluginError:  # (a broken plugin is no suggestion; selecting it says why)
            continue
    return None


def check_attention_choice(
    config: EngineConfig, plugins: Plugins, device: torch.device, *, ask_device: bool = True
) -> None:
    """The backends ``config.attn`` names (none for auto, which picks among the usable ones) asked
    what the runner asks them before the model loads: whether they run on ``device`` (their
    ``availability``; ``ask_device`` False skips it, for a launcher on a GPU, where asking may
    start CUDA in a process that runs no model), whether each runs its role's steps, reads the
    KV pool's dtype and takes the page size. :class:`NotRunnableHere` (a ValueError) naming the
    fix, before any process starts or the engine begins: ``LLM(attn="triton")`` under Triton's
    interpreter was refused from inside the engine, a RuntimeError, once its start had begun."""
    names = attention_names(config.attn)
    if not names:
        return
    resolve = (
        plugins.resolve_on_device if ask_device else lambda kind, name, _device: plugins.resolve(kind, name)
    )
    backends = {name: resolve("attention", name, device) for name in names}
    dtype = config.resolve_dtype(device)
    kv_dtype = config.resolve_kv_dtype(dtype)
    needs = frozenset({"kv_fp8"}) if kv_dtype == torch.float8_e4m3fn else frozenset()
    check_roles(names[0], names[-1], backends, plugins, device, plugins.spelling, needs)
    check_kv_dtype(config.kv_cache_dtype, kv_dtype, dtype, backends, plugins.spelling)
    resolve_page_size(config.page_size, device, backends, plugins.spelling)


def build_backend(name: str, cls: type[AttentionBackend], config: AttentionConfig) -> AttentionBackend:
    """``cls(config)``; a ``ValueError`` from it (the backend refuses this model's heads, this pool's
    dtype on this GPU...) becomes a one-line :class:`PluginError` naming the backend."""
    try:
        return cls(config)
    except ValueError as exc:
        raise PluginError(f"attention backend {name!r} cannot run this model: {exc}") from exc


def check_kv_dtype(
    name: str,
    kv_dtype: torch.dtype,
    dtype: torch.dtype,
    backends: dict[str, type[AttentionBackend]],
    spelling: Spelling = "flag",
) -> None:
    """A KV pool in another dtype than the run's needs backends that declare reading it."""
    if kv_dtype == dtype:
        return
    if kv_dtype == torch.float8_e4m3fn:
        refusing = sorted(n for n, cls in backends.items() if "kv_fp8" not in cls.capabilities)
        if refusing:
            raise NotRunnableHere(
                f"attention backend {refusing[0]!r} does not support {given('kv_cache_dtype', name, spelling)} "
                '(it does not declare "kv_fp8"); '
                f"use {given('attn', 'fi', spelling)} or "
                f"{given('attn', 'torch', spelling)}, or {given('kv_cache_dtype', 'auto', spelling)}"
            )


def attention_needs(spec: KVSpec, spelling: Spelling = "flag") -> dict[str, tuple[str, str]]:
    """What the model's attention asks of the backends beyond causal attention: for each
    capability it needs, (why, in words; another fix than a backend declaring it, or "")."""
    needs: dict[str, tuple[str, str]] = {}
    if spec.logits_soft_cap:
        needs["soft_cap"] = (f"it caps attention scores (logits_soft_cap {spec.logits_soft_cap:g})", "")
        # (API 2.6: Gemma 2's attn_logit_softcapping)
    if spec.sliding_window:
        window, layers = spec.sliding_window, len(spec.window_layers)
        needs["sliding_window"] = (
            f"{layers} of its {spec.num_layers} layers attend through a sliding window of {window} "
            "tokens, shorter than the context",
            f"or {given('max_context_len', window, spelling)}, within which the window is full attention",
        )  # (API 2.7)
    return needs


def check_attention_needs(
    needs: dict[str, tuple[str, str]],
    names: tuple[str, str],
    backends: dict[str, type[AttentionBackend]],
    plugins: Plugins,
    device: torch.device,
    spelling: Spelling = "flag",
) -> None:
    """Both backends (prefill, decode: ``names``) must declare each capability of ``needs``
    (:func:`attention_needs`): one that does not would compute another model. The refusal
    suggests, for each role whose backend lacks one, a backend usable here that declares them
    all (called once the model is built, before its weights load: what the attention needs is
    known from the built model)."""
    wanted = frozenset(needs)
    for capability, (why, other_fix) in needs.items():
        lacking = [i for i, name in enumerate(names) if capability not in backends[name].capabilities]
        if not lacking:
            continue
        pair: list[str | None] = [
            role_partner(("prefill", "decode")[i], device, plugins, wanted) if i in lacking else name
            for i, name in enumerate(names)
        ]
        prefill, decode = pair
        if prefill is None or decode is None:
            fix = f"no attention backend installed declares it on {device}"
        else:
            fix = f"use {given('attn', prefill if prefill == decode else f'{prefill},{decode}', spelling)}"
        name = names[lacking[0]]
        raise PluginError(
            f"attention backend {name!r} cannot run this model: {why} and {name!r} does not declare "
            f'"{capability}"; {fix}{f", {other_fix}" if other_fix else ""}'
        )


def _note_graph_settings_unused(config: EngineConfig, device: torch.device, spelling: Spelling) -> None:
    """A warning for each CUDA-graph setting given a value of its own on a device without CUDA
    graphs (the CPU): accepted there (one command line serves either machine), never silently."""
    defaults = EngineConfig.__dataclass_fields__
    for name in ("cuda_graph_max_bs", "piecewise_cuda_graph_max_tokens"):
        value = getattr(config, name)
        if value not in (0, defaults[name].default):
            logger.warning(
                "%s has no effect on %s: CUDA graphs run on CUDA GPUs only",
                given(name, value, spelling),
                device,
            )


class ModelRunner:
    def __init__(self, config: EngineConfig, parallel: ParallelContext, plugins: Plugins) -> None:
        self.config = config
        self.parallel = parallel
        # Before anything reads a switch: the kernels and the all-reduce ask fast_paths.current().
        fast_paths.configure(config.fast_paths)
        self.device = config.resolve_device()
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", parallel.tp_rank % torch.cuda.device_count())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
            if parallel.tp_size > 1:
                from minisgl_core.distributed import enable_fast_all_reduce

                enable_fast_all_reduce(parallel, self.device)
        self.dtype = config.resolve_dtype(self.device)
        self.kv_dtype = config.resolve_kv_dtype(self.dtype)
        # a float8 pool under ``--attn auto``: backends that read one (fa3 does not)
        needs = frozenset({"kv_fp8"}) if self.kv_dtype == torch.float8_e4m3fn else frozenset()
        prefill_name, decode_name = pick_attention(config.attn, self.device, plugins, needs)
        attn_classes = {name: self._backend_class(name, plugins) for name in (prefill_name, decode_name)}
        #: how errors name the settings (``--model`` or ``model=``): as the caller's user gives them
        self.spelling = plugins.spelling
        check_roles(prefill_name, decode_name, attn_classes, plugins, self.device, self.spelling, needs)
        check_kv_dtype(config.kv_cache_dtype, self.kv_dtype, self.dtype, attn_classes, self.spelling)
        self.page_size = resolve_page_size(config.page_size, self.device, attn_classes, self.spelling)
        #: the model on disk, through its weight format (safetensors, or a plugin's: GGUF...)
        self.source = open_model(config.model, plugins)
        #: the path :meth:`stage_weights` is loading (None: none), as the loader's errors name it
        self._staging: str | None = None
        #: config.json as the model class reads it (its ``read_config``: a nested text_config
        #: flattened, its config class's defaults filled in)
        self.hf_config = model_config(self.source.hf_config(), plugins)

        def fit_attention(model: torch.nn.Module) -> None:
            """Attention that caps its scores (Gemma 2) or slides a window shorter than the context
            (Mistral, Gemma 2), known once the model is built and checked before its weights load:
            ``--attn auto`` picks again among the backends declaring what it needs; a named one is
            checked."""
            nonlocal prefill_name, decode_name, attn_classes, needs
            spec = model.kv_spec
            model_needs = attention_needs(spec, self.spelling)
            if not model_needs:
                return
            needs |= frozenset(model_needs)
            if config.attn == "auto":
                prefill_name, decode_name = pick_attention(config.attn, self.device, plugins, needs)
                attn_classes = {
                    name: self._backend_class(name, plugins) for name in (prefill_name, decode_name)
                }
                self.page_size = resolve_page_size(config.page_size, self.device, attn_classes, self.spelling)
                fallback = AUTO_FALLBACK in (prefill_name, decode_name)
                if self.device.type == "cuda" and fallback and "sliding_window" in model_needs:
                    logger.warning(  # (pick_attention said which backend lacks what)
                        "the model's sliding window is shorter than the context; %s keeps the GPU kernels",
                        given("max_context_len", spec.sliding_window, self.spelling),
                    )
            check_attention_needs(
                model_needs, (prefill_name, decode_name), attn_classes, plugins, self.device, self.spelling
            )

        self.max_context_len = config.context_len(self.hf_config)
        # The last KV page and one spare page-table row are kept out of the scheduler's hands:
        # padded (dummy) requests of CUDA-graph replays write there.
        self.num_request_rows = config.max_running_requests + 1

        def fit_memory(model: torch.nn.Module) -> None:
            """A KV pool (``num_kv_tokens``) or request tables (``max_running_requests``) past the
            memory free, refused before the weights load (minutes for a large model), not after;
            checked again once they are in (a pool sized from free memory is checked then only)."""
            fit_attention(model)
            spec = model.kv_spec
            pool, tables = self._memory_asks(
                self._num_kv_pages(spec.num_layers, spec.num_kv_heads, spec.head_dim) + 1
                if config.num_kv_tokens is not None
                else 0,
                spec.num_layers,
                spec.num_kv_heads,
                spec.head_dim,
            )
            asks = [pool, tables] if config.num_kv_tokens is not None else [tables]
            check_fits(asks, self.device, free_bytes(self.device))

        self.model = self._load_model(plugins, before_weights=fit_memory)
        #: (first id, ids) of this rank's slice of the vocabulary while the model returns only
        #: that slice of the logits (TP > 1, a ParallelLMHead, vocabulary-parallel sampling on);
        #: None while it returns every id's. :meth:`full_logits` gathers the rest.
        self.logit_shard: tuple[int, int] | None = None
        #: (columns, true ids) of that slice as the model returns it (the last rank's may be padded)
        self.logit_shard_shape: tuple[int, int] | None = None
        head = getattr(self.model, "lm_head", None)
        if (
            parallel.tp_size > 1
            and isinstance(head, ParallelLMHead)
            and config.fast_paths.enabled("vocab_parallel_sampling")
        ):
            head.gather_output = False
            self.logit_shard = (head.vocab_start, head.valid_rows)
            self.logit_shard_shape = (head.rows_per_rank, head.valid_rows)
            self._vocab_ids = head.num_embeddings
        spec = self.model.kv_spec
        max_pos = int(self.hf_config.get("max_position_embeddings", 4096))
        if config.max_context_len and config.max_context_len > max_pos and parallel.tp_rank == 0:
            logger.warning(  # named as the user set it: ``--max-context-len N`` or ``max_context_len=N``
                "%s is more than the model's max_position_embeddings %d: using %d",
                given("max_context_len", config.max_context_len, self.spelling), max_pos, max_pos,
            )  # fmt: skip
        self.vocab_size = int(self.hf_config["vocab_size"])
        num_pages = self._num_kv_pages(spec.num_layers, spec.num_kv_heads, spec.head_dim) + 1
        #: a decode step's sequences for each request: one, or a speculative verify step's 1 + drafts
        self.sequences_per_request = (
            1 + config.speculative_num_draft_tokens if config.speculative_algorithm else 1
        )
        pool, tables = self._memory_asks(num_pages, spec.num_layers, spec.num_kv_heads, spec.head_dim)
        check_fits([pool, tables], self.device, free_bytes(self.device))
        with refusing_failed_allocation(pool, self.device):
            self.kv_cache = KVCache(
                num_layers=spec.num_layers,
                num_pages=num_pages,
                page_size=self.page_size,
                num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim,
                dtype=self.kv_dtype,
                device=self.device,
            )
        with refusing_failed_allocation(tables, self.device):
            self.page_table = torch.zeros(
                (self.num_request_rows, self.max_context_len), dtype=torch.int32, device=self.device
            )
        self.usable_kv_pages = num_pages - 1
        self.dummy_slot = self.usable_kv_pages * self.page_size
        attn_config = AttentionConfig(
            num_qo_heads=spec.num_qo_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            scale=spec.scale,
            page_size=self.page_size,
            dtype=self.dtype,
            device=self.device,
            max_requests=self.num_request_rows,
            max_context_len=self.max_context_len,
            kv_cache=self.kv_cache,
            max_sequences=self.num_request_rows * self.sequences_per_request,
            logits_soft_cap=spec.logits_soft_cap,
            sliding_window=spec.sliding_window,
            window_layers=spec.window_layers,
        )
        self.prefill_attn = build_backend(prefill_name, attn_classes[prefill_name], attn_config)
        try:
            self.decode_attn = (
                self.prefill_attn
                if decode_name == prefill_name
                else build_backend(decode_name, attn_classes[decode_name], attn_config)
            )
        except PluginError as exc:
            # ``--attn auto``: the next usable decode backend where the first refuses this model
            # (the Triton kernel: a head size that is not a power of two, float8 KV before sm89)
            rest = decode_fallbacks(config.attn, decode_name, self.device, plugins, needs)
            if not rest:
                raise
            logger.info(
                "%s: %s; decoding with %r instead", given("attn", "auto", self.spelling), exc, rest[0]
            )
            decode_name = rest[0]
            self.decode_attn = build_backend(
                decode_name, self._backend_class(decode_name, plugins), attn_config
            )
        self.attn_names = (prefill_name, decode_name)
        #: decode steps grouped by shared prefix (cascade): not for a model whose sliding window
        #: applies, whose prefix a window may partly hide (every bundled backend would attend such
        #: a step plainly); the groups' host work and a second set of decode graphs are saved
        self.cascade = (
            config.cascade and "cascade" in self.decode_attn.capabilities and not attn_config.sliding_window
        )
        #: prefill steps carry the running decodes where the prefill backend takes decode rows
        #: (by default on a CPU only, see EngineConfig.mixed_batch)
        wanted = config.mixed_batch if config.mixed_batch is not None else self.device.type != "cuda"
        self.mixed = wanted and "mixed" in self.prefill_attn.capabilities
        #: a mixed step's decode rows attend on the decode backend (runner/split_mixed.py): by
        #: default on a GPU, where the prefill kernel's decode rows cost several times a decode
        #: kernel's; MINISGL_SPLIT_MIXED=0 turns it off, =1 on anywhere (the CPU tests)
        self.split_mixed = None
        split = environment.switch("MINISGL_SPLIT_MIXED", self.device.type == "cuda")
        if self.mixed and split:
            if SplitMixedAttention.pairs(self.prefill_attn, self.decode_attn):
                self.split_mixed = SplitMixedAttention(self.prefill_attn, self.decode_attn)
        self.graphs = None
        if self.device.type == "cuda" and config.cuda_graph_max_bs > 0:
            if "cuda_graph" in self.decode_attn.capabilities:
                from minisgl_core.runner.cuda_graph import GraphRunner

                self.graphs = GraphRunner(
                    self.model,
                    self.decode_attn,
                    self.page_table,
                    self.dummy_slot,
                    config.cuda_graph_max_bs,
                    cascade=self.cascade,
                    single_gpu=self.parallel.tp_size == 1,
                    sequences_per_request=self.sequences_per_request,
                )
            else:
                logger.info("attention backend %s does not support CUDA graphs; running eagerly", decode_name)
        elif self.device.type != "cuda" and self.parallel.tp_rank == 0:
            _note_graph_settings_unused(config, self.device, self.spelling)
        self.prefill_graphs = None
        if self._wants_piecewise():
            from minisgl_core.runner.piecewise import PiecewiseGraphs

            self.prefill_graphs = PiecewiseGraphs(
                self.model,
                self.prefill_attn,
                self.dummy_slot,
                min(config.piecewise_cuda_graph_max_tokens, config.max_prefill_tokens),
                self.device,
            )

        self._warm_up_prefill()
        if self.split_mixed is not None and self.device.type == "cuda":
            self._warm_up_split_decode()

    # ------------------------------------------------------------------ set-up

    @torch.inference_mode()
    def _warm_up_prefill(self) -> None:
        """One prefill forward of a single dummy token (the spare page-table row, the reserved KV
        slot that padded graph replays write to), so that what attention builds on first use is
        built at start-up and not in the first request: FlashInfer's JIT takes about a minute
        for its FA3 prefill module on a fresh machine (BENCHMARKS.md). Decode attention is run by
        the decode graphs' capture already."""
        started = time.perf_counter()
        device = self.device
        batch = self._spare_batch(1, 1, self.prefill_attn, is_prefill=True)
        self.prepare(batch)()
        if device.type == "cuda":
            # and one of the length from which the rope/KV-store kernel takes its second tile shape
            # (a compile of ~0.6 s that would otherwise stall the first long prefill)
            wide = ROPE_STORE_WIDE_FROM
            if wide <= min(self.config.max_prefill_tokens, self.max_context_len):
                long = self._spare_batch(1, wide, self.prefill_attn, is_prefill=True, new_tokens=wide)
                self.prepare(long)()
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        if seconds > 1:
            logger.info("prefill attention (%s) warmed up in %.1f s", self.attn_names[0], seconds)

    @torch.inference_mode()
    def _warm_up_split_decode(self) -> None:
        """The decode backend run eagerly once per batch size a split mixed step can give it,
        plain and with one shared prefix: the decode graphs' capture built its kernels for the
        captured sizes only, and a Triton decode kernel compiled for another size in the middle
        of a run took 0.6-1.4 s of a mixed step on an H200 (Llama-3.1-8B, 2026-11-28)."""
        started = time.perf_counter()
        attn, device, config = self.decode_attn, self.device, self.decode_attn.config
        page = config.page_size
        for bs in range(1, self.num_request_rows):
            # each row one token past a page of the spare row, that page shared by all
            for shared in (None, [SharedPrefix(0, bs, page)]) if self.cascade else (None,):
                batch = self._spare_batch(bs, page + 1, attn, is_prefill=False, shared=shared)
                set_layout(batch)
                attn.prepare_metadata(batch)
                q = torch.zeros(bs, config.num_qo_heads, config.head_dim, dtype=config.dtype, device=device)
                kv = torch.zeros(bs, config.num_kv_heads, config.head_dim, dtype=config.dtype, device=device)
                attn.forward(q, kv, kv, 0, batch)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        logger.info(
            "decode attention (%s) warmed up for split mixed steps in %.1f s", self.attn_names[1], seconds
        )

    def _spare_batch(
        self, rows: int, seq_len: int, attn: AttentionBackend, *, is_prefill: bool,
        shared: list[SharedPrefix] | None = None, new_tokens: int = 1,
    ) -> ForwardBatch:  # fmt: skip
        """A warm-up batch of ``rows`` sequences on the spare page-table row (every entry the
        reserved KV slot that padded graph replays write to), each adding ``new_tokens`` tokens,
        the last at position ``seq_len - 1``."""
        device = self.device
        spare = self.num_request_rows - 1
        self.page_table[spare, :seq_len] = self.dummy_slot
        tokens = rows * new_tokens
        positions = torch.arange(seq_len - new_tokens, seq_len, dtype=torch.int64, device=device)
        return ForwardBatch(
            is_prefill=is_prefill,
            # token 1: id 0 is a zero (padding) embedding in some checkpoints, this is any token
            input_ids=torch.full((tokens,), min(1, self.vocab_size - 1), dtype=torch.int64, device=device),
            positions=positions.repeat(rows),
            out_cache_loc=torch.full((tokens,), self.dummy_slot, dtype=torch.int64, device=device),
            req_slots=torch.full((rows,), spare, dtype=torch.int32, device=device),
            seq_lens=torch.full((rows,), seq_len, dtype=torch.int32, device=device),
            extend_lens=torch.full((rows,), new_tokens, dtype=torch.int32, device=device),
            seq_lens_cpu=[seq_len] * rows,
            extend_lens_cpu=[new_tokens] * rows,
            page_table=self.page_table,
            logits_indices=torch.arange(new_tokens - 1, tokens, new_tokens, device=device),
            attn=attn,
            shared_prefixes=shared,
        )

    @property
    def _model_given(self) -> str:
        """The model setting as the user gave it, for errors: ``--model DIR`` or ``model='DIR'``
        (``model_path DIR`` while :meth:`stage_weights` loads one)."""
        if self._staging is not None:
            return f"model_path {self._staging}"
        return given("model", self.config.model, self.spelling)

    @property
    def _config_source(self) -> str:
        """Where the model's config comes from, for errors: config.json, or another format's
        metadata (a GGUF file has no config.json)."""
        return "config.json" if isinstance(self.source, SafetensorsFormat) else "the file's metadata"

    def _load_model(
        self,
        plugins: Plugins,
        before_weights: Callable[[torch.nn.Module], None] | None = None,
        device: torch.device | None = None,
    ) -> torch.nn.Module:
        """Build the model of ``self.hf_config`` on ``device`` (the runner's) and load its weights
        from ``self.source``; ``before_weights(model)`` runs between the two (a refusal there
        reads no weight)."""
        device = self.device if device is None else device
        # again here: a weight format other than a safetensors directory (GGUF), or Engine() alone
        try:
            check_config_values(self.hf_config, self._config_source)
        except ValueError as exc:
            raise ModelPathError(f"{self._model_given}: {exc}") from None
        archs = self.hf_config.get("architectures") or []
        if not archs:
            raise ValueError(f"the config of {self.source.path} has no 'architectures' entry")
        arch = archs[0]
        model_cls = plugins.resolve("models", arch)
        model_config = ModelConfig(
            self.hf_config, self.dtype, device, self.parallel, self.config.context_len(self.hf_config)
        )
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(device):
                model = model_cls(model_config)
        except KeyError as exc:  # a model reads config.json's keys by name
            raise ModelPathError(
                f"{self._model_given}: {self._config_source} has no {exc.args[0]!r}, which {arch} needs"
            ) from exc
        except NotImplementedError as exc:  # a setting the model cannot build (rope_scaling yarn...)
            raise ModelPathError(unbuildable_message(self._model_given, arch, str(exc))) from exc
        finally:
            torch.set_default_dtype(default_dtype)
        if before_weights is not None:
            before_weights(model)
        method = quantization.make_quantization(self.config.quantization, plugins, device, self.dtype)
        if method is not None:
            quantization.before_loading(model, method)
        seen: list[str] = []
        streamed = False
        reading = [False]  # the source was reading the next tensor (vs the model loading the last)

        def tracked():
            nonlocal streamed
            import threading

            from tqdm import tqdm

            # A thread lock for tqdm's bars: its default adds a multiprocessing lock, a semaphore
            # that a worker process's os._exit leaves behind (the resource tracker warned about a
            # "leaked semaphore" at every server stop).
            tqdm.set_lock(threading.RLock())
            progress = tqdm(
                desc=f"loading {self.source.model_name}",
                total=self.source.num_weights(),
                unit="tensor",
                disable=self.parallel.tp_rank != 0,
                leave=False,
            )
            with progress:
                weights = iter(self.source.weights(self.dtype))
                while True:
                    reading[0] = True  # (a failure now is the format's, reading the next tensor)
                    try:
                        name, tensor = next(weights)
                    except StopIteration:
                        break
                    reading[0] = False
                    seen.append(name)
                    progress.update(1)
                    yield name, tensor
            streamed = True

        try:
            used = model.load_weights(tracked())
        except (ConfigError, ModelPathError):
            raise
        except ValueError as exc:
            # A loader refuses a tensor that does not fit the model config.json built (the launcher's
            # header check knows the Llama layout only); say which tensor, not the layer's traceback.
            # (a failure reading the next tensor was blamed on the one before it)
            where = (
                "" if streamed or not seen
                else f"reading the weights after {seen[-1]}: " if reading[0]
                else f"weight {seen[-1]}: "
            )  # fmt: skip
            raise ModelPathError(
                f"{self._model_given}: {where}{exc} ({self._config_source} does not describe these weights?)"
            ) from exc
        unused = sorted(set(seen) - set(used))
        if unused:
            shown = ", ".join(unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
            logger.warning("%s did not use %d checkpoint tensors: %s", arch, len(unused), shown)
        bad = _non_finite_weight(model)
        if bad is not None:
            # (a finite value past float16's range became infinite in the cast: the checkpoint
            # was called corrupt although it ran under bfloat16 and float32)
            why = (
                "past float16's range (±65504) once cast to it, or the checkpoint is corrupt; try "
                f"{given('dtype', 'bfloat16', self.spelling)}"
                if self.dtype == torch.float16
                else "the checkpoint is corrupt"
            )
            raise ModelPathError(f"{self._model_given}: weight {bad} holds NaN or infinite values: {why}")
        if method is not None:
            quantization.after_loading(model, method)
        return model.eval()

    def stage_weights(self, path: str, plugins: Plugins) -> torch.nn.Module:
        """The model at ``path`` (SGLang's ``/update_weights_from_disk``), loaded as at start-up
        into a second copy beside the one serving, which stays as it is: a ModelPathError naming
        what does not fit (a config that differs from the served one's, a tensor of another
        shape, no memory for the copy). The served model takes the weights with
        :meth:`adopt_weights`; every rank stages first, so a rank that fails leaves them all on
        the old weights.

        The copy goes where there is room for it (:meth:`_staging_device`): on the GPU beside the
        served weights, else (the KV pool has taken the GPU, as it does by default) in host
        memory, for a model whose weights are plain floating-point tensors; the served model's
        tensors take them from there."""
        old_source, old_config = self.source, self.hf_config
        try:
            source = open_model(path, plugins)
            hf_config = model_config(source.hf_config(), plugins)
            differ = sorted(
                key
                for key in {*hf_config, *self.hf_config} - _CONFIG_KEYS_NOT_BUILT
                if hf_config.get(key) != self.hf_config.get(key)
            )
            if differ:
                shown = ", ".join(
                    f"{key} {short_repr(hf_config.get(key))} (served: {short_repr(self.hf_config.get(key))})"
                    for key in differ[:6]
                ) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
                raise ModelPathError(
                    f"model_path {path}: its config differs from the served model's in {shown}; new "
                    "weights must be for the same model (to serve another, restart the server with it)"
                )
            self.source, self.hf_config, self._staging = source, hf_config, path
            device = self._staging_device(path)
            try:
                staged = self._load_model(plugins, device=device)
            except torch.OutOfMemoryError:
                # (the GPU's free memory was read before loading; something took it meanwhile)
                if device.type != "cuda" or not self._host_stageable():
                    raise ModelPathError(
                        f"model_path {path}: no memory on {device} for a second copy of the weights "
                        f"while the served ones stay in place; {self._staging_fix()}"
                    ) from None
                gc.collect()
                torch.cuda.empty_cache()
                device = self._staging_device(path, on_host=True)
                staged = self._load_model(plugins, device=device)
            if device != self.device:
                logger.info("new weights staged in host memory: the GPU has no room for a second copy")
        finally:
            self.source, self.hf_config, self._staging = old_source, old_config, None
        if self.logit_shard is not None:  # (as the served model's head was set at start-up)
            staged.lm_head.gather_output = False
        new = _weight_slots(staged)
        graphs = self.graphs is not None or self.prefill_graphs is not None
        for name, (_, _, value) in _weight_slots(self.model).items():
            other = new.get(name, (None, None, None))[2]
            if isinstance(value, torch.Tensor):
                if not isinstance(other, torch.Tensor) or (other.shape, other.dtype) != (
                    value.shape,
                    value.dtype,
                ):
                    found = (
                        f"{tuple(other.shape)} {other.dtype}" if isinstance(other, torch.Tensor) else "none"
                    )
                    raise ModelPathError(
                        f"model_path {path}: {name} is {tuple(value.shape)} {value.dtype} in the served "
                        f"model, {found} in the new one (its config.json describes another shape)"
                    )
            elif other != value and graphs:
                # (a quantization method's scalar, e.g. int8's scale boost: the graphs hold it)
                raise ModelPathError(
                    f"model_path {path}: {name} is {short_repr(other)} for the new weights, "
                    f"{short_repr(value)} for the served ones, which the captured CUDA graphs hold; "
                    "restart the server on the new weights"
                )
        return staged

    def _staging_device(self, path: str, on_host: bool = False) -> torch.device:
        """Where :meth:`stage_weights` loads the new weights: the runner's device while it has
        room for a second copy of the served model's tensors; on a GPU without it (or
        ``on_host``), host memory, for :meth:`_host_stageable` models; else a ModelPathError
        naming what to change (a process that ran out of host memory would be killed)."""
        need = _tensor_bytes(self.model) + STAGING_MARGIN_BYTES
        if not on_host:
            free = _free_for_tensors(self.device)
            if free is None or need <= free:
                return self.device
            if self.device.type != "cuda" or not self._host_stageable():
                raise ModelPathError(
                    f"model_path {path}: a second copy of the weights needs {_gib(need)} on "
                    f"{self.device} while the served ones stay in place, and {_gib(free)} is free; "
                    f"{self._staging_fix()}"
                )
        host = torch.device("cpu")
        room = free_bytes(host)
        if room is not None and need > room:
            raise ModelPathError(
                f"model_path {path}: a second copy of the weights needs {_gib(need)} while the served "
                f"ones stay in place; neither {self.device} nor host memory ({_gib(room)} free) has "
                f"it; {self._staging_fix()}"
            )
        return host

    def _host_stageable(self) -> bool:
        """Whether new weights may load in host memory and be copied over: no quantization method
        (whose load-time work may depend on the device: layouts, scales) and only floating-point
        tensors in the served model."""
        return self.config.quantization is None and all(
            value.dtype in (torch.float32, torch.bfloat16, torch.float16)
            for _, _, value in _weight_slots(self.model).values()
            if isinstance(value, torch.Tensor)
        )

    def _staging_fix(self) -> str:
        if self.device.type == "cuda" and self.config.quantization is not None:
            return (
                f"quantized weights ({given('quantization', self.config.quantization, self.spelling)}) "
                "load on the GPU only: start again with a smaller KV pool "
                f"({named('kv_memory_fraction', self.spelling)} or {named('num_kv_tokens', self.spelling)})"
            )
        return "free memory, or start again on the new weights"

    @torch.no_grad()
    def adopt_weights(self, staged: torch.nn.Module) -> None:
        """Copy the staged model's weights into the served model's tensors, in place: CUDA graphs
        and compiled prefill graphs read those tensors, so they run the new weights as captured.
        What a quantization method holds beside the weights (scales, plain values) comes along.
        A copy staged in host memory brings no non-persistent buffer (``inv_freq``: derived from
        the config, which is the served one's, and computed here on the device, as a fresh start
        on the new weights would)."""
        new = _weight_slots(staged)
        on_host = _device_of(staged) != _device_of(self.model)
        for name, (module, key, value) in _weight_slots(self.model).items():
            if isinstance(value, torch.Tensor):
                if on_host and key in module._non_persistent_buffers_set:
                    continue
                value.copy_(new[name][2])
            else:
                setattr(module, key, new[name][2])

    def _num_kv_pages(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        page = self.page_size
        if self.config.num_kv_tokens is not None:
            tokens = self.config.num_kv_tokens
        elif self.device.type == "cuda":
            per_token = KVCache.bytes_per_token(num_layers, num_kv_heads, head_dim, self.kv_dtype)
            free, _ = torch.cuda.mem_get_info(self.device)
            # Leave room for activations, CUDA graphs and the sampler.
            reserve = 4 << 30
            tokens = int(max(free - reserve, 0) * self.config.kv_memory_fraction) // per_token
            if self.parallel.tp_size > 1:  # every rank must see the same capacity
                t = torch.tensor([tokens], device=self.device)
                torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.parallel.group)
                tokens = int(t.item())
        else:
            tokens = self._cpu_kv_tokens(
                KVCache.bytes_per_token(num_layers, num_kv_heads, head_dim, self.kv_dtype)
            )
        check_page_size(page, self.max_context_len, tokens)
        pages = tokens // page
        if pages < 2:
            raise ConfigError(
                f"KV pool too small: {tokens} tokens, {pages} pages of {page}; the pool needs two pages at "
                "least: give more memory or a larger num_kv_tokens",
                "num_kv_tokens",
            )
        return pages

    def _cpu_kv_tokens(self, per_token: int) -> int:
        """The KV pool's size on a CPU without num_kv_tokens: what the run can use (every request
        row at max_context_len, at most CPU_DEFAULT_KV_TOKENS) within CPU_KV_MEMORY_SHARE of the
        free memory, or CPU_KV_MEMORY_MOST where that holds one request of max_context_len and the
        share does not. The host's ranks share its memory, so each takes its part."""
        context = self.max_context_len
        wanted = min(CPU_DEFAULT_KV_TOKENS, self.config.max_running_requests * context)
        free = free_bytes(self.device)
        if free is None:  # (not known: the allocation says if it fails)
            return wanted
        ranks = self.parallel.tp_size
        share = int(free * CPU_KV_MEMORY_SHARE) // ranks // per_token
        most = int(free * CPU_KV_MEMORY_MOST) // ranks // per_token
        tokens = min(wanted, max(share, context if context <= most else 0))
        if ranks > 1:  # every rank must see the same capacity
            t = torch.tensor([tokens], device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=self.parallel.group)
            tokens = int(t.item())
        if self.parallel.tp_rank == 0 and tokens < wanted:
            logger.info(
                "KV pool: %d tokens (%.1f GiB), sized to the %.1f GiB of memory free (%s sets another size)",
                tokens, tokens * per_token / (1 << 30), free / (1 << 30), named("num_kv_tokens", self.spelling),
            )  # fmt: skip
            if tokens < context:
                logger.warning(
                    "the KV pool holds %d tokens, fewer than max_context_len %d: a longer request is "
                    "refused; free some memory, or set %s",
                    tokens, context, named("num_kv_tokens", self.spelling),
                )  # fmt: skip
        return tokens

    def _memory_asks(
        self, num_pages: int, num_layers: int, num_kv_heads: int, head_dim: int
    ) -> tuple[MemoryAsk, MemoryAsk]:
        """What the KV pool and the request tables will take of the device."""
        tokens = num_pages * self.page_size
        per_token = KVCache.bytes_per_token(num_layers, num_kv_heads, head_dim, self.kv_dtype)
        pool = MemoryAsk(
            f"num_kv_tokens={self.config.num_kv_tokens or tokens - self.page_size} (the KV pool)",
            tokens * per_token,
            ("num_kv_tokens",),
        )
        # per row: its page-table row (int32 per position), then the engine's last token and the
        # scheduler's row index (int64 each)
        row_bytes = 4 * self.max_context_len + 16
        # (a length nobody gave: the model's, where it named only the flag)
        given_len = self.config.max_context_len
        whose = (
            ""
            if given_len is not None and given_len <= self.max_context_len
            else ", the model's max_position_embeddings"
        )
        tables = MemoryAsk(
            f"max_running_requests={self.config.max_running_requests} "
            f"(request rows of max_context_len={self.max_context_len} tokens{whose})",
            self.num_request_rows * row_bytes,
            ("max_running_requests", "max_context_len"),
        )
        return pool, tables

    def _wants_piecewise(self) -> bool:
        from minisgl_core.runner.piecewise import supports_piecewise

        config = self.config
        if (
            self.device.type != "cuda"
            or config.cuda_graph_max_bs == 0
            or config.piecewise_cuda_graph_max_tokens == 0
        ):
            return False
        if not supports_piecewise(self.model):
            logger.info(
                "%s has no hidden_states/logits_from: prefill steps run eagerly", type(self.model).__name__
            )
            return False
        return True

    def _backend_class(self, name: str, plugins: Plugins) -> type[AttentionBackend]:
        return plugins.resolve_on_device("attention", name, self.device)

    # ------------------------------------------------------------------ running

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """The batch's logits over the whole vocabulary."""
        return self.full_logits(self.prepare(batch)())

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` over the whole vocabulary: gathered from every rank while the model returns
        this rank's slice (:attr:`logit_shard`); every rank must call it for the same rows."""
        if self.logit_shard is None:
            return logits
        return self.parallel.all_gather(logits, dim=-1)[:, : self._vocab_ids]

    @torch.inference_mode()
    def prepare(self, batch: ForwardBatch) -> Callable[[], torch.Tensor]:
        """Everything of ``batch``'s forward that does not read its ``input_ids`` on the device
        (the attention's plan, a CUDA graph's other inputs); the call returned reads them and runs
        the model, returning the logits (this rank's slice of them while :attr:`logit_shard` is
        set). The engine launches a sampling that writes those input ids in between (a
        constrained step whose bitmask was being filled)."""
        if self.graphs is not None and not batch.is_prefill and self.graphs.can_run(batch):
            return self.graphs.prepare(batch)
        if self.split_mixed is not None and batch.is_prefill:
            if 0 < leading_decode_rows(batch) < batch.batch_size:
                batch.attn = self.split_mixed  # type: ignore[assignment]  # a backend in all the core reads
            else:  # the decode rows' cascade groups are for the decode backend only
                batch.shared_prefixes = None
        if self.prefill_graphs is not None and batch.is_prefill and self.prefill_graphs.can_run(batch):
            return self.prefill_graphs.prepare(batch)
        set_layout(batch)
        batch.attn.prepare_metadata(batch)

        @torch.inference_mode()
        def run() -> torch.Tensor:
            return self.model(batch)

        return run


#: the weight dtypes checked for NaN and infinities after loading (quantized ones hold codes)
_CHECKED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _weight_slots(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str, object]]:
    """Every tensor and plain value (bool, int, float) the model's layers hold, by dotted name,
    with the layer and attribute that hold it: parameters, buffers, and what a quantization method
    set as plain attributes (int8's ``weight_scale``, not in ``state_dict``)."""
    slots: dict[str, tuple[torch.nn.Module, str, object]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        held = [*module._parameters.items(), *module._buffers.items(), *vars(module).items()]
        for key, value in held:
            if key.startswith("_") or key == "training":
                continue
            if isinstance(value, torch.Tensor) or type(value) in (bool, int, float):
                slots[f"{prefix}.{key}" if prefix else key] = (module, key, value)
    return slots


#: room left beside a staged copy of the weights (the loader's transient tensors)
STAGING_MARGIN_BYTES = 256 << 20


def _tensor_bytes(model: torch.nn.Module) -> int:
    """The bytes of every tensor the model's layers hold (:func:`_weight_slots`; a tensor two
    layers share, a tied head, once)."""
    seen: dict[tuple[int, int], int] = {}
    for _, _, value in _weight_slots(model).values():
        if isinstance(value, torch.Tensor):
            seen[(value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())] = (
                value.untyped_storage().nbytes()
            )
    return sum(seen.values())


def _free_for_tensors(device: torch.device) -> int | None:
    """What new tensors on ``device`` can take: the device's free memory and, on a GPU, what
    PyTorch's allocator holds unused."""
    free = free_bytes(device)
    if free is not None and device.type == "cuda":
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free


def _device_of(model: torch.nn.Module) -> torch.device | None:
    return next((p.device for p in model.parameters()), None)


def _gib(size: int | None) -> str:
    return "an unknown amount" if size is None else f"{size / (1 << 30):.2f} GiB"


#: config.json keys that do not shape the built model: a checkpoint saved by a trainer may
#: differ from the served one in these (stage_weights compares the rest)
_CONFIG_KEYS_NOT_BUILT = frozenset(
    {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"}
)


@torch.inference_mode()
def _non_finite_weight(model: torch.nn.Module) -> str | None:
    """The name of the first parameter holding a NaN or an infinity, or None. A corrupt
    checkpoint loaded silently and every request then ended at once with empty text (NaN logits
    sample token 0). One pass over the weights; one device sync, not one per tensor."""
    named = [(name, p) for name, p in model.named_parameters() if p.dtype in _CHECKED_DTYPES]
    if not named:
        return None
    flags = torch.stack([torch.isfinite(p).all() for _, p in named]).tolist()
    return next((name for (name, _), finite in zip(named, flags) if not finite), None)

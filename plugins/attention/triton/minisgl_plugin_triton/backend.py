"""Paged decode attention in Triton, written for a float8 KV pool (``--attn fi,triton --kv-cache-dtype fp8_e4m3``).

Decode on the H200 is bound by reading the KV pool (a Qwen3-0.6B step at full batch is ≈ 77%
FlashInfer decode attention, which reads at ≈ 4 TB/s): a float8 pool halves the bytes, but
FlashInfer 0.7.0's decode kernel reads it no faster than bf16 (BENCHMARKS.md, "fp8 KV and 16-token
pages"). This backend's kernel (:mod:`minisgl_plugin_triton.kernels`) widens the float8 values in
registers and multiplies in float16 on tensor cores, so its time follows the bytes.

Decode only: pair it with a prefill backend that reads the same pool (``--attn fi,triton``).
No planning on the host: the kernel reads each sequence's slots from the core's page table
through ``batch.req_slots`` and its length from ``batch.seq_lens``, so a step costs two launches
(the split-KV merge only when the batch is too small to fill the GPU) and a CUDA-graph replay
copies two small vectors into the buffers the graph reads. On Hopper (fast path
``pdl_attention``) the decode kernel is launched with programmatic dependent launch: its programs
prefetch their first KV block into L2 while the core's rope + KV store kernel before it still
runs, then wait for it.

How many splits each sequence's KV is cut into depends on the batch size alone (graphs are
captured per batch size): enough (sequence, KV head, split) programs for ``programs_per_sm``
per SM, a power of two, at most ``MAX_SPLITS``; GQA groups of 8 query heads a KV head or more
aim for fewer (``wide_group_rule``).

Cascade (``batch.shared_prefixes``): each group's shared prefix is read once by the prefix
kernel for the query heads of up to ``prefix_rows // GQA group`` members at a time (a "task"),
split ``prefix_splits(batch size)`` ways; the decode kernel reads each member from the end of
its prefix on; the merge combines both. A step's plan is one small int32 table (order, skip,
tasks) copied to the device without waiting, so cascade graphs (captured with no groups) replay
any grouping of the batch.

Sliding window (``config.sliding_window`` in ``config.window_layers``, API 2.7): a windowed
layer's decode kernel starts each sequence's KV at ``seq_len - window`` (its splits share what is
left); such a model runs no cascade.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, ForwardBatch, SharedPrefix
from minisgl_core.layers.triton_ops import (
    pdl_attention_enabled,
    pdl_launch,
    pdl_options,
    triton_available,
    triton_runs_on,
)

#: most splits of one sequence's KV (a power of two: the merge reads them as one vector)
MAX_SPLITS = 32
#: the query heads of one KV head are rows of one tensor-core product, which has at least 16
MIN_BLOCK_H = 16
#: programs of the CPU interpreter's "GPU" (the tests): small, so small batches split too
INTERPRETER_SMS = 4


class TritonDecodeMetadata(NamedTuple):
    """What ``prepare_metadata`` leaves in ``batch.attn_metadata``."""

    #: [bs] int32 page-table rows and KV lengths the kernel reads (the graph's buffers when captured)
    req_slots: torch.Tensor
    seq_lens: torch.Tensor
    #: [bs] int32 the batch's sequences, longest first: the order the kernel's programs take them in
    order: torch.Tensor
    num_splits: int
    #: cascade only (else None / 0): [bs] int32 positions each sequence leaves to the prefix
    #: kernel; [3, >= bs] int32 tasks (first sequence, members, prefix length; 0 members: none)
    skip: torch.Tensor | None = None
    tasks: torch.Tensor | None = None
    prefix_splits: int = 0


class Launch(NamedTuple):
    """The kernel's launch: positions per step of its loop, warps, software-pipeline stages, and
    a cap on registers a thread (``maxnreg``, CUDA; None: ptxas's choice). The cap decides how
    many programs an SM holds: over a float8 pool the kernel takes 194 registers a thread at 128
    positions (ptxas for sm_90, ``cuobjdump -res-usage``), two programs an SM, where bf16 takes 96
    (five); it fits 168 at 128 positions, 128 at 64 and 96 at 32 with nothing spilled (three, four,
    five programs); tighter caps spill to the stack (128 at 128 positions: 112 bytes a thread).
    ``programs_per_sm``: what the split rule (:func:`splits_for`) aims for with this launch."""

    block_n: int
    num_warps: int
    num_stages: int
    maxnreg: int | None = None
    programs_per_sm: int = 4

    def options(self, interpreted: bool) -> dict:
        """The launch's keyword arguments (Triton's interpreter takes no register cap)."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if self.maxnreg is not None and not interpreted:
            options["maxnreg"] = self.maxnreg
        return options


def longest_first(seq_lens: list[int]) -> list[int]:
    """The indices of ``seq_lens`` by decreasing length."""
    return sorted(range(len(seq_lens)), key=seq_lens.__getitem__, reverse=True)


def padded_width(n: int) -> int:
    """``n`` columns rounded up to 16 int32s: each row of a table starts 64-byte aligned, as
    Triton specialises a kernel on (another aligned pointer, another stride divisible by 16 is
    another compile)."""
    return -(-n // 16) * 16


def host_table(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    """``rows`` as one int32 CPU tensor in pageable memory (zero-padded to ``width`` columns),
    copied from there without waiting (the driver stages a small pageable copy: 8-18 µs of host
    time on an H200 machine, where ``pin_memory()`` alone took 15-85 µs; the core's
    ``tools/device_h2d.py``)."""
    table = torch.tensor(rows, dtype=torch.int32)
    if width is not None and width > table.shape[1]:
        table = torch.nn.functional.pad(table, (0, width - table.shape[1]))
    return table


def cascade_plan(seq_lens: list[int], groups: list[SharedPrefix], members_per_task: int) -> list[list[int]]:
    """A cascade step's table, five rows of ``len(seq_lens)``: the decode kernel's order (longest
    own part first), each sequence's skip (its group's prefix length, 0 when alone), and the prefix
    kernel's tasks (first member, members, prefix length), each group cut into tasks of at most
    ``members_per_task`` members; unused task columns are zeros."""
    bs = len(seq_lens)
    skip = [0] * bs
    first, count, length = [0] * bs, [0] * bs, [0] * bs
    task = 0
    for g in groups:
        if not (0 <= g.start < g.end <= bs) or g.length <= 0:
            raise ValueError(f"shared prefix {g} falls outside the batch of {bs}")
        for member in range(g.start, g.end):
            if skip[member]:
                raise ValueError(f"shared prefixes overlap: {groups}")
            if g.length >= seq_lens[member]:
                raise ValueError(
                    f"shared prefix {g} is not shorter than sequence {member} ({seq_lens[member]})"
                )
            skip[member] = g.length
        for at in range(g.start, g.end, members_per_task):
            first[task], count[task], length[task] = at, min(members_per_task, g.end - at), g.length
            task += 1
    own = [n - k for n, k in zip(seq_lens, skip)]
    return [longest_first(own), skip, first, count, length]


def splits_for(batch_size: int, num_kv_heads: int, num_sms: int, programs_per_sm: int) -> int:
    """Splits per sequence: the smallest power of two giving ``programs_per_sm`` programs per
    SM, at most :data:`MAX_SPLITS` (1 when the batch alone fills the GPU)."""
    wanted = math.ceil(programs_per_sm * num_sms / max(1, batch_size * num_kv_heads))
    return min(MAX_SPLITS, 1 << max(0, wanted - 1).bit_length())


class TritonDecodeBackend(AttentionBackend):
    """Decode attention over the paged pool (bf16, fp16 or float8 e4m3), CUDA-graph capable."""

    capabilities = frozenset(
        {"decode", "page_size>1", "cuda_graph", "cascade", "prestored_kv", "kv_fp8", "sliding_window"}
    )
    name: ClassVar[str] = "triton"
    #: programs per SM the split rule aims for (None: the launch's ``programs_per_sm``)
    programs_per_sm: ClassVar[int | None] = None
    #: the kernel's launch by the pool's element size; swept on an H200 (BENCHMARKS.md): a float8
    #: pool wants more bytes in flight per program than a bf16 one, and its 168-register cap lets an
    #: SM hold three programs instead of two (211 -> 176 us a layer at batch 256, nothing spilled).
    #: A bf16 pool splits from five programs an SM down: at 77 sequences of an offline run's
    #: lengths (616 programs unsplit) two splits read a layer 10% faster, at 111 (888) the same
    launches: ClassVar[dict[int, Launch]] = {
        1: Launch(128, 4, 3, maxnreg=168),
        2: Launch(64, 4, 2, programs_per_sm=5),
        4: Launch(32, 4, 2),
    }
    #: the launch by element size where a batch has fewer sequence x KV-head pairs than
    #: ``wide_below`` an SM and splits its KV ``wide_splits_most`` ways at most: 128 positions a
    #: loop step, more bytes in flight for the fewer programs (bf16, an offline run's lengths: 3-4%
    #: faster a layer at 23 and 48 sequences, slower at 77; at 8 or fewer, 16-32 splits of a few
    #: dozen positions each, a step 7-20% slower end to end)
    wide_launches: ClassVar[dict[int, Launch]] = {2: Launch(128, 4, 2, programs_per_sm=5)}
    wide_below: ClassVar[int] = 3
    wide_splits_most: ClassVar[int] = 4
    #: GQA groups of ``wide_group`` query heads a KV head or more, by the pool's element size:
    #: (programs an SM the split rule aims for, ``wide_below``) in place of the launch's. Over a
    #: bf16 pool at Qwen3-30B-A3B's 32 query and 4 KV heads (an offline run's lengths, one H200,
    #: ``tools/device_decode_layout.py --qo-heads 32 --kv-heads 4 --sweep``, BENCHMARKS.md) the
    #: five-an-SM rule split too often: 153 sequences read a layer in 80.1 µs unsplit at 128
    #: positions a loop step against 84.8 split two ways, 77 sequences in 61.0 split two ways
    #: against 68.1 split four; at 256 the unsplit 64-position launch stays the fastest
    wide_group: ClassVar[int] = 8
    wide_group_rule: ClassVar[dict[int, tuple[int, int]]] = {2: (3, 5)}
    #: the prefix kernel's (cascade) query rows per program (members x GQA group, padded to the
    #: decode kernel's ``BLOCK_H`` at least); it launches as the decode kernel does. 64 rows
    #: (Hopper's warp-group products, 8 warps) ran the shared-prefix workload at half FlashInfer's
    #: speed with groups of four (8 of the 64 rows used): BENCHMARKS.md
    prefix_rows: ClassVar[int] = 16
    #: the rounding error of the probabilities as a second bf16/fp16 product (float32-accurate P·V);
    #: off: P rounded once, normalised by the rounded sum. Both pass tools/device_e2e.py; the
    #: second product cost 10% of the kernel's time at batch 256 (BENCHMARKS.md)
    exact_pv: ClassVar[bool] = False
    #: the decode kernel's first ``early_blocks`` blocks of K and V prefetched into L2 before it
    #: waits for the kernel before it (``EARLY``, CUDA only): always (a test), or where its launch
    #: overlaps that kernel (fast path ``pdl_attention``, sm90+); never in a cascade step
    early_kv: ClassVar[bool] = False
    early_blocks: ClassVar[int] = 1

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        device = torch.device(device)
        if not triton_available():
            return f"the {cls.name} attention backend needs Triton: pip install triton"
        if not triton_runs_on(device):
            return (
                f"the {cls.name} attention backend runs on CUDA GPUs (or on the CPU under TRITON_INTERPRET=1), "
                f"not on {device.type!r}"
            )
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return f"the {cls.name} attention backend needs a CUDA GPU, but torch.cuda.is_available() is False"
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) < (8, 0):
                return f"the {cls.name} attention backend needs an sm80+ GPU; this one is sm{major}{minor}"
        return None

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        head_dim = config.head_dim
        if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
            raise ValueError(
                f"the {self.name} attention backend needs a power-of-two head_dim in 16..256, got {head_dim}"
            )
        if config.num_qo_heads % config.num_kv_heads:
            raise ValueError(
                f"{config.num_qo_heads} query heads do not divide into {config.num_kv_heads} KV heads"
            )
        self.group = config.num_qo_heads // config.num_kv_heads
        self.block_h = max(MIN_BLOCK_H, 1 << (self.group - 1).bit_length())
        self.block_m = max(self.block_h, self.prefix_rows)
        self.members_per_task = self.block_m // self.group
        self.interpreted = config.device.type != "cuda"
        if config.device.type == "cuda":
            capability = torch.cuda.get_device_capability(config.device)
            if config.kv_cache.dtype == torch.float8_e4m3fn and capability < (8, 9):
                raise ValueError(
                    f"the {self.name} attention backend reads a float8 KV pool on sm89+ GPUs only (Triton "
                    f"has no e4m3 before); this one is sm{capability[0]}{capability[1]}: use --attn fi"
                )
            self.num_sms = torch.cuda.get_device_properties(config.device).multi_processor_count
        else:
            self.num_sms = INTERPRETER_SMS
        element_size = config.kv_cache.buffer.element_size()
        self.launch = self.launches[element_size]
        self.wide_launch = self.wide_launches.get(element_size)
        self.per_sm, self.wide_below_per_sm = self.launch.programs_per_sm, self.wide_below
        if self.group >= self.wide_group and element_size in self.wide_group_rule:
            self.per_sm, self.wide_below_per_sm = self.wide_group_rule[element_size]
        # One buffer of partial outputs for the largest batch x splits any batch size asks for (a
        # speculative verify step's batch holds several sequences a request: max_sequences).
        most = max(
            bs * (self.splits(bs) + self.prefix_splits(bs)) for bs in range(1, config.max_sequences + 1)
        )
        self.partial = torch.empty(
            most * config.num_qo_heads * head_dim, dtype=torch.float32, device=config.device
        )
        self.partial_lse = torch.empty(most * config.num_qo_heads, dtype=torch.float32, device=config.device)
        self._graph_req_slots: torch.Tensor | None = None
        self._graph_seq_lens: torch.Tensor | None = None
        self._graph_plan: torch.Tensor | None = None
        self._kernels: Any = None

    def _per_sm(self) -> int:
        return self.programs_per_sm or self.per_sm

    def splits(self, batch_size: int) -> int:
        return splits_for(batch_size, self.config.num_kv_heads, self.num_sms, self._per_sm())

    def prefix_splits(self, batch_size: int) -> int:
        """Splits of each shared prefix (cascade), from the batch size alone, sized for groups of
        four or more: about ``batch_size / 4`` tasks."""
        return splits_for(max(1, batch_size // 4), self.config.num_kv_heads, self.num_sms, self._per_sm())

    def decode_launch(self, batch_size: int, splits: int) -> Launch:
        """The decode kernel's launch for ``batch_size`` sequences split ``splits`` ways (the step's
        own, from its metadata): the wide one below ``wide_below`` sequence x KV-head pairs an SM
        (``wide_group_rule``'s for large GQA groups) at ``wide_splits_most`` splits or fewer, where
        the pool's element size has one."""
        pairs = batch_size * self.config.num_kv_heads
        if (
            self.wide_launch is not None
            and pairs < self.wide_below_per_sm * self.num_sms
            and splits <= self.wide_splits_most
        ):
            return self.wide_launch
        return self.launch

    def _plan(self, seq_lens: list[int], groups: list[SharedPrefix] | None) -> list[list[int]]:
        """The step's table: the order alone, or a cascade plan (``groups`` not None). A model with
        a sliding window runs no cascade (a window may hide part of a shared prefix): the order
        alone, which gives the same result, in graphs captured for cascade too."""
        if groups is None or self.config.sliding_window:
            return [longest_first(seq_lens)]
        return cascade_plan(seq_lens, groups, self.members_per_task)

    def _metadata(
        self, req_slots: torch.Tensor, seq_lens: torch.Tensor, plan: torch.Tensor, bs: int
    ) -> TritonDecodeMetadata:
        if bs > self.config.max_sequences:  # the partial outputs would run past their buffer
            raise ValueError(
                f"a decode step of {bs} sequences is more than the {self.config.max_sequences} the "
                f"{self.name} attention backend was built for (AttentionConfig.max_sequences)"
            )
        if plan.shape[0] == 1:
            return TritonDecodeMetadata(req_slots, seq_lens, plan[0], self.splits(bs))
        return TritonDecodeMetadata(
            req_slots, seq_lens, plan[0], self.splits(bs), plan[1], plan[2:], self.prefix_splits(bs)
        )

    # --- per step ---

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        if batch.is_prefill or max(batch.extend_lens_cpu) > 1:
            raise ValueError(
                f"the {self.name} attention backend runs decode steps only; pair it with a prefill "
                f"backend: --attn fi,{self.name}"
            )
        # no groups (``[]``): a plain step, which gives the same result
        device = batch.seq_lens.device
        plan = host_table(
            self._plan(batch.seq_lens_cpu, batch.shared_prefixes or None), padded_width(batch.batch_size)
        )
        plan = plan.to(device, non_blocking=True)
        batch.attn_metadata = self._metadata(batch.req_slots, batch.seq_lens, plan, batch.batch_size)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.config.kv_cache.store(layer_id, batch.out_cache_loc, k, v)
        return self.attend(q, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        metadata: TritonDecodeMetadata = batch.attn_metadata
        config, cache = self.config, self.config.kv_cache
        kernels = self._load_kernels()
        bs = q.shape[0]
        if q.stride(2) != 1:
            q = q.contiguous()
        out = torch.empty(bs, config.num_qo_heads, config.head_dim, dtype=q.dtype, device=q.device)
        splits, prefix_splits = metadata.num_splits, metadata.prefix_splits
        entries = splits + prefix_splits
        cascade = metadata.skip is not None
        page_table = batch.page_table
        launch = self.launch
        widen_fp8 = cache.dtype == torch.float8_e4m3fn
        dot_fp32 = self.interpreted and q.dtype == torch.bfloat16
        exact_pv = self.exact_pv and not widen_fp8 and not dot_fp32
        scale_log2 = config.scale * math.log2(math.e)
        if cascade:
            assert metadata.tasks is not None
            kernels.prefix_kernel[(config.num_kv_heads, bs, prefix_splits)](
                q,
                cache.k_cache(layer_id),
                cache.v_cache(layer_id),
                page_table,
                metadata.req_slots,
                metadata.tasks,
                self.partial,
                self.partial_lse,
                scale_log2,
                q.stride(0),
                q.stride(1),
                cache.num_kv_heads * config.head_dim,
                page_table.stride(0),
                metadata.tasks.stride(0),
                NUM_HEADS=config.num_qo_heads,
                GROUP=self.group,
                BLOCK_M=self.block_m,
                HEAD_DIM=config.head_dim,
                BLOCK_N=launch.block_n,
                NUM_SPLITS=splits,
                PREFIX_SPLITS=prefix_splits,
                WIDEN_FP8=widen_fp8,
                DOT_FP32=dot_fp32,
                EXACT_PV=exact_pv,
                **launch.options(self.interpreted),
                **pdl_options(q.device),
            )
        early_launch = not cascade and pdl_attention_enabled(q.device)
        early = early_launch or (self.early_kv and not cascade and not self.interpreted)
        decode_pdl = pdl_launch() if early_launch else pdl_options(q.device)
        launch = self.decode_launch(bs, splits)
        kernels.decode_kernel[(config.num_kv_heads, bs, splits)](
            q,
            cache.k_cache(layer_id),
            cache.v_cache(layer_id),
            page_table,
            metadata.req_slots,
            metadata.seq_lens,
            metadata.order,
            metadata.skip if cascade else metadata.order,
            out,
            self.partial,
            self.partial_lse,
            scale_log2,
            q.stride(0),
            q.stride(1),
            cache.num_kv_heads * config.head_dim,
            page_table.stride(0),
            out.stride(0),
            out.stride(1),
            NUM_HEADS=config.num_qo_heads,
            GROUP=self.group,
            BLOCK_H=self.block_h,
            HEAD_DIM=config.head_dim,
            BLOCK_N=launch.block_n,
            NUM_SPLITS=splits,
            ENTRIES=entries,
            CASCADE=cascade,
            WIDEN_FP8=widen_fp8,
            DOT_FP32=dot_fp32,
            EXACT_PV=exact_pv,
            EARLY=early,
            EARLY_BLOCKS=self.early_blocks,
            EARLY_LINE=min(config.head_dim, 128 // cache.buffer.element_size()),
            WINDOW=config.window_of(layer_id),  # (a model compiles two variants at most)
            **launch.options(self.interpreted),
            **decode_pdl,
        )
        if entries > 1:
            kernels.merge_kernel[(bs, config.num_qo_heads)](
                self.partial,
                self.partial_lse,
                metadata.skip if cascade else metadata.order,
                out,
                out.stride(0),
                out.stride(1),
                NUM_HEADS=config.num_qo_heads,
                HEAD_DIM=config.head_dim,
                ENTRIES=entries,
                OWN_ENTRIES=splits,
                ENTRIES_P2=1 << (entries - 1).bit_length(),
                CASCADE=cascade,
                num_warps=4,
                **pdl_options(q.device),
            )
        return out

    def _load_kernels(self) -> Any:
        if self._kernels is None:
            from minisgl_plugin_triton import kernels

            self._kernels = kernels
        return self._kernels

    # --- CUDA graphs ---

    def init_graph_capture(self, max_batch_size: int) -> None:
        device = self.config.device
        self._graph_req_slots = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self._graph_seq_lens = torch.ones(max_batch_size, dtype=torch.int32, device=device)
        # order, skip and the prefix tasks of every step a graph replays (rows of max_batch_size)
        self._graph_plan = torch.zeros(5, padded_width(max_batch_size), dtype=torch.int32, device=device)

    def prepare_capture(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = self._graph_metadata(batch)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        self._graph_metadata(batch)

    def _graph_metadata(self, batch: ForwardBatch) -> TritonDecodeMetadata:
        """The batch's rows, lengths and plan copied into the fixed buffers a captured graph reads
        (a cascade graph, captured with ``shared_prefixes=[]``, replays any groups)."""
        if self._graph_req_slots is None or self._graph_seq_lens is None or self._graph_plan is None:
            raise RuntimeError("call init_graph_capture() before prepare_capture()")
        bs = batch.batch_size
        if bs > self._graph_req_slots.numel():
            raise ValueError(
                f"batch size {bs} exceeds init_graph_capture's max_batch_size {self._graph_req_slots.numel()}"
            )
        req_slots = self._graph_req_slots[:bs]
        seq_lens = self._graph_seq_lens[:bs]
        table = self._plan(batch.seq_lens_cpu, batch.shared_prefixes)
        plan = self._graph_plan[: len(table), :bs]
        req_slots.copy_(batch.req_slots, non_blocking=True)
        seq_lens.copy_(batch.seq_lens, non_blocking=True)
        plan.copy_(host_table(table), non_blocking=True)
        return self._metadata(req_slots, seq_lens, plan, bs)

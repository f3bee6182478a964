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
copies two small vectors into the buffers the graph reads.

How many splits each sequence's KV is cut into depends on the batch size alone (graphs are
captured per batch size): enough (sequence, KV head, split) programs for ``programs_per_sm``
per SM, a power of two, at most ``MAX_SPLITS``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, ForwardBatch
from minisgl_core.layers.triton_ops import triton_available, triton_runs_on

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


class Launch(NamedTuple):
    """The kernel's launch: positions per step of its loop, warps, software-pipeline stages."""

    block_n: int
    num_warps: int
    num_stages: int


def longest_first(seq_lens: list[int], device: torch.device) -> torch.Tensor:
    """The indices of ``seq_lens`` by decreasing length, on ``device``, copied without waiting."""
    order = sorted(range(len(seq_lens)), key=seq_lens.__getitem__, reverse=True)
    host = torch.tensor(order, dtype=torch.int32)
    if device.type == "cuda":
        # pinned, so the copy does not wait; PyTorch keeps the block until the copy has run
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def splits_for(batch_size: int, num_kv_heads: int, num_sms: int, programs_per_sm: int) -> int:
    """Splits per sequence: the smallest power of two giving ``programs_per_sm`` programs per
    SM, at most :data:`MAX_SPLITS` (1 when the batch alone fills the GPU)."""
    wanted = math.ceil(programs_per_sm * num_sms / max(1, batch_size * num_kv_heads))
    return min(MAX_SPLITS, 1 << max(0, wanted - 1).bit_length())


class TritonDecodeBackend(AttentionBackend):
    """Decode attention over the paged pool (bf16, fp16 or float8 e4m3), CUDA-graph capable."""

    capabilities = frozenset({"decode", "page_size>1", "cuda_graph", "prestored_kv", "kv_fp8"})
    name: ClassVar[str] = "triton"
    #: programs per SM the split rule aims for
    programs_per_sm: ClassVar[int] = 4
    #: the kernel's launch by the pool's element size; swept on an H200 (BENCHMARKS.md): a float8
    #: pool wants more bytes in flight per program than a bf16 one
    launches: ClassVar[dict[int, Launch]] = {1: Launch(128, 4, 3), 2: Launch(64, 4, 2), 4: Launch(32, 4, 2)}

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
        # One buffer of partial outputs for the largest batch x splits any batch size asks for.
        most = max(bs * self.splits(bs) for bs in range(1, config.max_requests + 1))
        self.partial = torch.empty(
            most * config.num_qo_heads * head_dim, dtype=torch.float32, device=config.device
        )
        self.partial_lse = torch.empty(most * config.num_qo_heads, dtype=torch.float32, device=config.device)
        self.launch = self.launches[config.kv_cache.buffer.element_size()]
        self._graph_req_slots: torch.Tensor | None = None
        self._graph_seq_lens: torch.Tensor | None = None
        self._graph_order: torch.Tensor | None = None
        self._kernels: Any = None

    def splits(self, batch_size: int) -> int:
        return splits_for(batch_size, self.config.num_kv_heads, self.num_sms, self.programs_per_sm)

    # --- per step ---

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        if batch.is_prefill or max(batch.extend_lens_cpu) > 1:
            raise ValueError(
                f"the {self.name} attention backend runs decode steps only; pair it with a prefill "
                f"backend: --attn fi,{self.name}"
            )
        order = longest_first(batch.seq_lens_cpu, batch.seq_lens.device)
        batch.attn_metadata = TritonDecodeMetadata(
            batch.req_slots, batch.seq_lens, order, self.splits(batch.batch_size)
        )

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
        splits = metadata.num_splits
        page_table = batch.page_table
        launch = self.launch
        kernels.decode_kernel[(config.num_kv_heads, bs, splits)](
            q,
            cache.k_cache(layer_id),
            cache.v_cache(layer_id),
            page_table,
            metadata.req_slots,
            metadata.seq_lens,
            metadata.order,
            out,
            self.partial,
            self.partial_lse,
            config.scale * math.log2(math.e),
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
            WIDEN_FP8=cache.dtype == torch.float8_e4m3fn,
            DOT_FP32=self.interpreted and q.dtype == torch.bfloat16,
            num_warps=launch.num_warps,
            num_stages=launch.num_stages,
        )
        if splits > 1:
            kernels.merge_kernel[(bs, config.num_qo_heads)](
                self.partial,
                self.partial_lse,
                out,
                out.stride(0),
                out.stride(1),
                NUM_HEADS=config.num_qo_heads,
                HEAD_DIM=config.head_dim,
                NUM_SPLITS=splits,
                num_warps=4,
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
        self._graph_order = torch.arange(max_batch_size, dtype=torch.int32, device=device)

    def prepare_capture(self, batch: ForwardBatch) -> None:
        batch.attn_metadata = self._graph_metadata(batch)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        self._graph_metadata(batch)

    def _graph_metadata(self, batch: ForwardBatch) -> TritonDecodeMetadata:
        """The batch's rows, lengths and order copied into the fixed buffers a captured graph reads."""
        if self._graph_req_slots is None or self._graph_seq_lens is None or self._graph_order is None:
            raise RuntimeError("call init_graph_capture() before prepare_capture()")
        bs = batch.batch_size
        if bs > self._graph_req_slots.numel():
            raise ValueError(
                f"batch size {bs} exceeds init_graph_capture's max_batch_size {self._graph_req_slots.numel()}"
            )
        req_slots = self._graph_req_slots[:bs]
        seq_lens = self._graph_seq_lens[:bs]
        order = self._graph_order[:bs]
        req_slots.copy_(batch.req_slots, non_blocking=True)
        seq_lens.copy_(batch.seq_lens, non_blocking=True)
        order.copy_(longest_first(batch.seq_lens_cpu, order.device), non_blocking=True)
        return TritonDecodeMetadata(req_slots, seq_lens, order, self.splits(bs))

"""FlashInfer paged attention for minisgl (``--attn fi``).

Once per step :meth:`FlashInferBackend.prepare_metadata` plans one FlashInfer wrapper from the
batch's CSR page layout, which the core computes once per batch (page ids on the device from
``batch.layout``, offsets on the host from ``batch.host_layout``; see :mod:`minisgl_plugin_fi.planning`): the paged prefill wrapper (causal, any
page size) for prefill/extend steps, the tensor-core decode wrapper for decode steps. Every layer
then writes its new K/V into the pool and runs the planned wrapper over its own pages, so the
planning (host-side scheduling work) happens once per step, not once per layer.

CUDA graphs (decode only): :meth:`init_graph_capture` allocates one set of fixed index buffers
(``indptr``/``indices``/``last_page_len``) sized for the largest batch and every page a batch can
reference; each captured batch size gets its own graph-mode decode wrapper over views of those
buffers, and :meth:`prepare_replay` re-plans it, which rewrites the buffers in place.

Cascade (decode batches with ``shared_prefixes``, see :mod:`minisgl_plugin_fi.cascade`): two
passes and a merge per layer. The prefix pass runs the paged prefill kernel, non-causal, with one
entry per group whose query rows are all the group's sequences, over the shared prefix's pages,
so the prefix is read once per group instead of once per sequence; a sequence of no group is an
entry of its own over all its pages. The suffix pass is the decode kernel over each grouped
sequence's pages after the prefix. The two are merged by their log-sum-exp (rows of no group keep
the prefix pass's result). Captured in CUDA graphs like plain decode, with the prefix pass's entry
list padded to the batch size by empty entries, since graph-mode wrappers keep their batch size.

Sliding window (``config.sliding_window`` in ``config.window_layers``, API 2.7: Mistral, Gemma 2):
FlashInfer takes the window when a wrapper is planned (``window_left``, the keys a query sees
before its own: ``sliding_window - 1``), so each window the layers use gets its own wrappers, all
planned every step from the same layout: one set for a model whose every layer slides (Mistral),
two (full and windowed) for one that alternates (Gemma 2). Graph-mode wrappers of one batch size
share the fixed index buffers (both plans write the same layout there). A windowed model runs no
cascade: the window may hide part of a shared prefix, and plain decode gives the same result, in
the graphs captured for cascade too.

``flashinfer`` is imported in ``__init__`` only, so importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from minisgl_core.api import AttentionBackend, AttentionConfig, ForwardBatch, PagedLayout
from minisgl_core.layers.fused import merge_attention_states
from minisgl_plugin_fi.availability import cuda_unavailable_reason, module_installed
from minisgl_plugin_fi.cascade import CascadeLayout, cascade_layout
from minisgl_plugin_fi.planning import PlanFences, int32

if TYPE_CHECKING:
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

#: Decode runs on tensor cores (the FA2 prefill kernel, one query row per sequence) at every GQA
#: group size: measured best in the engine (Qwen3-0.6B offline 20.6k tok/s). Alone, FlashInfer's
#: CUDA-core decode kernel reads the KV ~9% faster at group 2 (H200, bf16, head_dim 128, bs 256 x
#: 800, graph replay: 213 vs 232 µs) and ~45% slower at group 4; it has not had a clean A/B in
#: the engine yet (BENCHMARKS.md). ``MINISGL_FI_TENSOR_CORES=0`` selects it.


def tensor_cores_from_env(value: str | None) -> bool:
    """``MINISGL_FI_TENSOR_CORES``: off for 0, false, off or no (the core's spellings of its own
    switches; only "0" counted), on otherwise."""
    return (value or "").strip().lower() not in ("0", "false", "off", "no")


#: float workspace for split-KV partial results, shared by every wrapper of one backend (the
#: wrappers run one after another on one stream); FlashInfer recommends 128 MiB
WORKSPACE_BYTES = 128 << 20

#: ``attend(q, (k_cache, v_cache)) -> out``: the planned kernel over one layer's paged K/V
Attend = Callable[[torch.Tensor, "tuple[torch.Tensor, torch.Tensor]"], torch.Tensor]


class FlashInferMetadata(NamedTuple):
    """What ``prepare_metadata`` leaves in ``batch.attn_metadata``."""

    #: the planned kernel of each window the layers use (``FlashInferBackend.window_lefts``)
    attends: tuple[Attend, ...]


class GraphBuffers(NamedTuple):
    """The fixed int32 index buffers every captured decode graph reads (views for smaller sizes)."""

    #: [max_batch_size + 1]
    kv_indptr: torch.Tensor
    #: [max_batch_size * pages per max_context_len]
    kv_indices: torch.Tensor
    #: [max_batch_size]
    kv_last_page_len: torch.Tensor


class CascadeGraphBuffers(NamedTuple):
    """The prefix pass's fixed buffers for the cascade decode graphs (views for smaller sizes)."""

    #: [max_batch_size + 1]: one entry per group or lone sequence, padded with empty entries
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    #: [max_batch_size * pages per max_context_len]
    kv_indices: torch.Tensor
    #: [max_batch_size]
    kv_last_page_len: torch.Tensor
    #: [max_batch_size] bool: the sequence is in a group (its suffix pass counts)
    in_group: torch.Tensor


class FlashInferBackend(AttentionBackend):
    """Causal paged attention with GQA on FlashInfer kernels, CUDA-graph capable for decode."""

    capabilities = frozenset(
        {
            "prefill", "decode", "page_size>1", "cuda_graph", "cascade", "prestored_kv", "kv_fp8", "mixed",
            "soft_cap", "sliding_window",
        }
    )  # fmt: skip
    #: FlashInfer kernel family for prefill/extend; "fa2" runs on sm80+ and shares its JIT module
    #: with the tensor-core decode kernel (one compile). The fa3 plugin swaps in "fa3".
    prefill_kernels: ClassVar[str] = "fa2"
    name: ClassVar[str] = "fi"

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        reason = cuda_unavailable_reason(device, backend=cls.name, min_capability=(8, 0))
        if reason is None and not module_installed("flashinfer"):
            reason = f"the {cls.name} attention backend needs FlashInfer: pip install flashinfer-python"
        return reason

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        import flashinfer  # the heavy import, deferred until a backend is actually built

        self._flashinfer: Any = flashinfer
        #: FlashInfer's ``window_left`` of each pass, in the order of ``FlashInferMetadata.attends``:
        #: -1 (causal) and/or ``sliding_window - 1``, each only where some layer uses it
        self.window_lefts, self._pass_of_layer = window_passes(config)
        # Zeroed: FlashInfer requires the float workspace to start at 0 on first use.
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=config.device)
        self.prefill_wrappers = tuple(
            flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", backend=self.prefill_kernels
            )
            for _ in self.window_lefts
        )
        self.decode_tensor_cores = tensor_cores_from_env(os.environ.get("MINISGL_FI_TENSOR_CORES"))
        self.decode_wrappers = tuple(self._decode_wrapper() for _ in self.window_lefts)
        #: batch size -> one graph-mode decode wrapper a pass
        self.graph_wrappers: dict[int, tuple[BatchDecodeWithPagedKVCacheWrapper, ...]] = {}
        self._graph_buffers: GraphBuffers | None = None
        # Cascade: the prefix pass (paged prefill kernel); its suffix pass reuses the decode wrappers.
        self.prefix_wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.cascade_graph_wrappers: dict[
            int, tuple[BatchPrefillWithPagedKVCacheWrapper, BatchDecodeWithPagedKVCacheWrapper]
        ] = {}
        self._cascade_buffers: CascadeGraphBuffers | None = None
        self._fences = PlanFences()

    # --- per step ---

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        if self._cascade(batch) and not batch.is_prefill:
            batch.attn_metadata = self._plan_cascade(
                self.prefix_wrapper, self.decode_wrappers[0], batch, pad=False
            )
            return
        layout = batch.layout
        if batch.is_prefill or max(batch.extend_lens_cpu) > 1:
            batch.attn_metadata = FlashInferMetadata(
                tuple(
                    self._plan_prefill(wrapper, batch, layout, left)
                    for wrapper, left in zip(self.prefill_wrappers, self.window_lefts, strict=True)
                )
            )
        else:
            batch.attn_metadata = self._plan_decode(self.decode_wrappers, batch, layout)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.config.kv_cache.store(layer_id, batch.out_cache_loc, k, v)
        return self.attend(q, layer_id, batch)

    def attend(self, q: torch.Tensor, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        cache = self.config.kv_cache
        metadata: FlashInferMetadata = batch.attn_metadata
        attend = metadata.attends[self._pass_of_layer.get(layer_id, 0)]
        out = attend(q.to(self.config.dtype), (cache.k_cache(layer_id), cache.v_cache(layer_id)))
        return out.to(q.dtype)

    def _cascade(self, batch: ForwardBatch) -> bool:
        """Whether a step runs as cascade: it carries ``shared_prefixes`` and the model has no
        sliding window (plain decode gives the same result)."""
        return batch.shared_prefixes is not None and not self.config.sliding_window

    # --- CUDA graphs (decode) ---

    def init_graph_capture(self, max_batch_size: int) -> None:
        config = self.config
        device = config.device
        pages_per_seq = (config.max_context_len + config.page_size - 1) // config.page_size
        # Sized by sequences x pages rather than by the pool: with prefix sharing, several
        # sequences list the same page, so a batch may reference more entries than the pool has.
        self._graph_buffers = GraphBuffers(
            kv_indptr=torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_batch_size * pages_per_seq, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_batch_size, dtype=torch.int32, device=device),
        )
        self._cascade_buffers = CascadeGraphBuffers(
            qo_indptr=torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device),
            kv_indptr=torch.zeros(max_batch_size + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_batch_size * pages_per_seq, dtype=torch.int32, device=device),
            kv_last_page_len=torch.ones(max_batch_size, dtype=torch.int32, device=device),
            in_group=torch.zeros(max_batch_size, dtype=torch.bool, device=device),
        )

    def prepare_capture(self, batch: ForwardBatch) -> None:
        if self._cascade(batch):
            prefix, suffix = self._cascade_graph_wrappers(batch.batch_size)
            batch.attn_metadata = self._plan_cascade(prefix, suffix, batch, pad=True)
            return
        wrappers = self._graph_wrappers(batch.batch_size)
        batch.attn_metadata = self._plan_decode(wrappers, batch, batch.layout)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        # Planning a graph-mode wrapper copies the layout into the buffers the graph reads.
        if self._cascade(batch):
            cascade = self.cascade_graph_wrappers.get(batch.batch_size)
            if cascade is None:
                raise RuntimeError(f"no cascade decode graph was captured for batch size {batch.batch_size}")
            batch.attn_metadata = self._plan_cascade(*cascade, batch, pad=True)
            return
        wrappers = self.graph_wrappers.get(batch.batch_size)
        if wrappers is None:
            raise RuntimeError(f"no decode graph was captured for batch size {batch.batch_size}")
        batch.attn_metadata = self._plan_decode(wrappers, batch, batch.layout)

    # --- planning, overridable by backends that reuse this one (fa3) ---

    def _plan_prefill(
        self,
        wrapper: BatchPrefillWithPagedKVCacheWrapper,
        batch: ForwardBatch,
        layout: PagedLayout,
        window_left: int,
    ) -> Attend:
        """One pass of a prefill/extend step: ``wrapper`` planned with ``window_left``."""
        config = self.config
        host = batch.host_layout
        with self._fences.planning(wrapper):
            wrapper.plan(
                host.qo_indptr,
                host.kv_indptr,
                layout.kv_indices,
                host.kv_last_page_len,
                config.num_qo_heads,
                config.num_kv_heads,
                config.head_dim,
                config.page_size,
                causal=True,
                window_left=window_left,
                **self._kernel_options(),
            )
        # One output buffer for every layer of this batch: FlashInfer's run() otherwise allocates
        # (and zero-fills) one per call, ≈ 22 µs of host time a layer outside CUDA graphs. Each
        # layer's output is consumed (o_proj, or the piecewise graphs' copy) before the next
        # layer's attention runs on the same stream; every row is written (qo_indptr covers them).
        out = torch.empty(
            batch.num_tokens, config.num_qo_heads, config.head_dim, dtype=config.dtype, device=config.device
        )
        run = wrapper.run

        def attend(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return run(q, kv, out=out)

        return attend

    def _plan_decode(
        self,
        wrappers: tuple[BatchDecodeWithPagedKVCacheWrapper, ...],
        batch: ForwardBatch,
        layout: PagedLayout,
    ) -> FlashInferMetadata:
        """A decode step: each pass's wrapper planned with its window."""
        config = self.config
        host = batch.host_layout
        # Split-KV stays on even for full batches: without it the graph replay of bs 32 x 1500
        # tokens took 71.6 instead of 56.7 µs per layer (tools/device_profile.py attn).
        options = self._kernel_options()
        for wrapper, window_left in zip(wrappers, self.window_lefts, strict=True):
            with self._fences.planning(wrapper):
                wrapper.plan(
                    host.kv_indptr,
                    layout.kv_indices,
                    host.kv_last_page_len,
                    config.num_qo_heads,
                    config.num_kv_heads,
                    config.head_dim,
                    config.page_size,
                    window_left=window_left,
                    **options,
                )
        return FlashInferMetadata(tuple(wrapper.run for wrapper in wrappers))

    def _plan_cascade(
        self,
        prefix_wrapper: BatchPrefillWithPagedKVCacheWrapper,
        suffix_wrapper: BatchDecodeWithPagedKVCacheWrapper,
        batch: ForwardBatch,
        pad: bool,
    ) -> FlashInferMetadata:
        config = self.config
        layout: CascadeLayout = cascade_layout(batch, config.page_size, pad_entries=pad)
        prefix, suffix = layout.prefix, layout.suffix
        in_group = int32(layout.in_group).to(config.device, non_blocking=True).bool()
        if pad:  # a graph reads the flags from its fixed buffer
            assert self._cascade_buffers is not None
            in_group = self._cascade_buffers.in_group[: batch.batch_size].copy_(in_group, non_blocking=True)
        options = self._kernel_options()
        with self._fences.planning(prefix_wrapper):
            prefix_wrapper.plan(
                int32(layout.qo_indptr),
                int32(prefix.kv_indptr),
                prefix.kv_indices,
                int32(prefix.kv_last_page_len),
                config.num_qo_heads,
                config.num_kv_heads,
                config.head_dim,
                config.page_size,
                causal=False,
                **options,
            )
        with self._fences.planning(suffix_wrapper):
            suffix_wrapper.plan(
                int32(suffix.kv_indptr),
                suffix.kv_indices,
                int32(suffix.kv_last_page_len),
                config.num_qo_heads,
                config.num_kv_heads,
                config.head_dim,
                config.page_size,
                **options,
            )

        def attend(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            out, lse = prefix_wrapper.run(q, kv, return_lse=True)
            suffix_out, suffix_lse = suffix_wrapper.run(q, kv, return_lse=True)
            return merge_attention_states(out, lse, suffix_out, suffix_lse, in_group)

        return FlashInferMetadata((attend,))

    def _kernel_options(self) -> dict[str, Any]:
        return {
            "sm_scale": self.config.scale,
            # (API 2.6) every plan() takes it, prefill and decode alike; None (no cap) as before
            "logits_soft_cap": self.config.logits_soft_cap or None,
            "q_data_type": self.config.dtype,
            "kv_data_type": self.config.kv_cache.dtype,
        }

    def _decode_wrapper(self, graph_batch_size: int | None = None) -> BatchDecodeWithPagedKVCacheWrapper:
        options: dict[str, Any] = {"use_tensor_cores": self.decode_tensor_cores, "backend": "fa2"}
        if graph_batch_size is not None:
            buffers = self._graph_buffers
            assert buffers is not None
            options.update(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=buffers.kv_indptr[: graph_batch_size + 1],
                paged_kv_indices_buffer=buffers.kv_indices,
                paged_kv_last_page_len_buffer=buffers.kv_last_page_len[:graph_batch_size],
            )
        return self._flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD", **options)

    def _cascade_graph_wrappers(
        self, batch_size: int
    ) -> tuple[BatchPrefillWithPagedKVCacheWrapper, BatchDecodeWithPagedKVCacheWrapper]:
        buffers = self._cascade_buffers
        if buffers is None:
            raise RuntimeError("call init_graph_capture() before prepare_capture()")
        self._graph_wrappers(batch_size)  # checks the size against init_graph_capture's
        if batch_size not in self.cascade_graph_wrappers:
            prefix = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace,
                "NHD",
                backend="fa2",
                use_cuda_graph=True,
                qo_indptr_buf=buffers.qo_indptr[: batch_size + 1],
                paged_kv_indptr_buf=buffers.kv_indptr[: batch_size + 1],
                paged_kv_indices_buf=buffers.kv_indices,
                paged_kv_last_page_len_buf=buffers.kv_last_page_len[:batch_size],
            )
            # The suffix pass reads the plain decode graphs' index buffers: one graph replays at a
            # time. (A windowed model runs no cascade: one pass, no window.)
            self.cascade_graph_wrappers[batch_size] = (prefix, self._decode_wrapper(batch_size))
        return self.cascade_graph_wrappers[batch_size]

    def _graph_wrappers(self, batch_size: int) -> tuple[BatchDecodeWithPagedKVCacheWrapper, ...]:
        buffers = self._graph_buffers
        if buffers is None:
            raise RuntimeError("call init_graph_capture() before prepare_capture()")
        if batch_size > buffers.kv_last_page_len.numel():
            raise ValueError(
                f"batch size {batch_size} exceeds init_graph_capture's max_batch_size "
                f"{buffers.kv_last_page_len.numel()}"
            )
        if batch_size not in self.graph_wrappers:
            # one a pass, on the same fixed buffers (each plan writes the same layout there)
            self.graph_wrappers[batch_size] = tuple(
                self._decode_wrapper(batch_size) for _ in self.window_lefts
            )
        return self.graph_wrappers[batch_size]


def window_passes(config: AttentionConfig) -> tuple[tuple[int, ...], dict[int, int]]:
    """The ``window_left`` of each pass a step plans (-1: causal; ``sliding_window - 1``: the
    window), in order, and each layer's pass: one pass unless some layers slide and some do not."""
    layers = range(config.kv_cache.num_layers)
    lefts = [config.window_of(layer) - 1 if config.window_of(layer) else -1 for layer in layers]
    passes = tuple(sorted(set(lefts))) or (-1,)
    return passes, {layer: passes.index(left) for layer, left in zip(layers, lefts, strict=True)}

"""FlashAttention-3 paged attention for minisgl on Hopper (``--attn fa3``).

Prefill/extend runs FlashAttention-3 kernels, through one of two paths picked when the backend
is built (:meth:`FlashAttention3Backend.prefill_path` says which):

- ``flash_attn_interface``: FlashAttention-3 itself (``pip install 'minisgl-plugin-fa3[flash-attn]'``),
  ``flash_attn_with_kvcache`` over the paged pool with a dense page table and varlen queries;
- ``flashinfer``: FlashInfer's SM90 FA3 prefill kernels (the fi backend with ``backend="fa3"``).

Decode, CUDA graphs, K/V storing and the CSR planning are the fi backend's, inherited unchanged:
FA3 gains nothing over FlashInfer's tensor-core decode for one query per sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from minisgl_plugin_fi.availability import cuda_unavailable_reason, module_installed
from minisgl_plugin_fi.backend import Attend, FlashInferBackend

if TYPE_CHECKING:
    from flashinfer import BatchPrefillWithPagedKVCacheWrapper

from minisgl_core.api import AttentionConfig, ForwardBatch, PagedLayout

FLASH_ATTN_MODULE = "flash_attn_interface"


class FlashAttention3Backend(FlashInferBackend):
    """The fi backend with FlashAttention-3 (SM90) kernels for prefill and extend."""

    # The fi backend's, less "kv_fp8": neither FA3 path has a kernel for bf16 queries over a
    # float8 pool (FlashInfer 0.7.0's SM90 prefill fails to build it: "No eligible GMMA operator
    # for request configuration"), so ``--attn auto`` prefills a float8 pool with fi and
    # ``--attn fa3`` refuses one at start.
    capabilities = FlashInferBackend.capabilities - {"kv_fp8"}
    prefill_kernels: ClassVar[str] = "fa3"
    name: ClassVar[str] = "fa3"

    @classmethod
    def prefill_path(cls) -> str:
        """``"flash_attn_interface"`` when FlashAttention-3 is installed, else ``"flashinfer"``."""
        return FLASH_ATTN_MODULE if module_installed(FLASH_ATTN_MODULE) else "flashinfer"

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        reason = cuda_unavailable_reason(device, backend=cls.name, min_capability=(9, 0), only_major=9)
        if reason is not None:
            return reason
        if not module_installed("flashinfer"):
            # Decode always runs on FlashInfer, so FlashAttention-3 alone is not enough.
            has_fa3 = "FlashAttention-3 is installed, but " if module_installed(FLASH_ATTN_MODULE) else ""
            return (
                f"the fa3 attention backend decodes with FlashInfer: {has_fa3}pip install flashinfer-python"
            )
        return None

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        self._flash_attn_with_kvcache: Any = None
        if self.prefill_path() == FLASH_ATTN_MODULE:
            from flash_attn_interface import flash_attn_with_kvcache

            self._flash_attn_with_kvcache = flash_attn_with_kvcache

    def _plan_prefill(
        self,
        wrapper: BatchPrefillWithPagedKVCacheWrapper,
        batch: ForwardBatch,
        layout: PagedLayout,
        window_left: int,
    ) -> Attend:
        if self._flash_attn_with_kvcache is None:
            return super()._plan_prefill(wrapper, batch, layout, window_left)
        page_size = self.config.page_size
        # FA3 wants a dense [bs, max_pages] table of page ids; entries past a sequence's last page
        # are never read (cache_seqlens bounds the keys).
        max_pages = max((n + page_size - 1) // page_size for n in batch.seq_lens_cpu)
        rows = batch.page_table[batch.req_slots.long(), : max_pages * page_size : page_size]
        page_table = (rows // page_size).to(torch.int32)
        options = {
            "cache_seqlens": batch.seq_lens.to(torch.int32),
            "page_table": page_table,
            "cu_seqlens_q": layout.qo_indptr,
            "max_seqlen_q": max(batch.extend_lens_cpu),
            "softmax_scale": self.config.scale,
            "softcap": self.config.logits_soft_cap,  # (API 2.6) 0.0: none, FlashAttention-3's default
            # bottom-right aligned: query j of an extend sees the cached prefix plus new tokens <= j
            "causal": True,
        }
        if window_left >= 0:  # (API 2.7) the keys a query sees before its own, none after
            options["window_size"] = (window_left, 0)
        flash_attn_with_kvcache = self._flash_attn_with_kvcache

        def attend(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            return flash_attn_with_kvcache(q, kv[0], kv[1], **options)

        return attend

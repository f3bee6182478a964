"""A CPU stand-in for the part of FlashInfer the fi backend calls, written from FlashInfer's
documented semantics, so the backend's own logic (the step's planning, its passes per sliding
window, cascade and its merge) runs under the attention conformance suite without a GPU.

Only the API surface the backend uses: ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchDecodeWithPagedKVCacheWrapper`` built over a workspace with the "NHD" layout, ``plan()``
with CSR page offsets, page ids and last-page lengths (plus ``causal``, ``window_left``,
``sm_scale``, ``logits_soft_cap``), and ``run(q, (k_cache, v_cache), out=, return_lse=)``.
Semantics, as FlashInfer documents them: queries are aligned to the end of their sequence's KV
(query ``j`` of ``n`` sits at position ``kv_len - n + j``); with ``causal`` a query sees keys up
to its own position, with ``window_left >= 0`` only the ``window_left`` keys before it as well;
the log-sum-exp is in base 2. The real kernels are held to the same suite on the GPU
(``test_fi_suite.py``); this double decides nothing about them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


class NoFences:
    """For a backend's ``_fences``: its plan fences wait on CUDA events; the CPU runs in order."""

    @contextmanager
    def planning(self, wrapper: object) -> Iterator[None]:
        yield


class OnCpu:
    """Mixed in before a FlashInfer-based backend class: available on the CPU (over this double),
    without plan fences."""

    @classmethod
    def availability(cls, device: torch.device) -> str | None:
        return None

    def __init__(self, config: Any) -> None:
        super().__init__(config)  # type: ignore[call-arg]
        self._fences = NoFences()


class _PagedAttention:
    def __init__(self, workspace: torch.Tensor, kv_layout: str = "NHD", **options: Any) -> None:
        if kv_layout != "NHD":
            raise ValueError(f"the double models the NHD layout only, not {kv_layout}")
        self.options = options
        self._plan: dict[str, Any] | None = None

    def _set_plan(
        self,
        qo_indptr: list[int],
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        page_size: int,
        causal: bool,
        window_left: int,
        sm_scale: float | None,
        logits_soft_cap: float | None,
    ) -> None:
        self._plan = {
            "qo_indptr": qo_indptr,
            "kv_indptr": [int(x) for x in kv_indptr.tolist()],
            "kv_indices": kv_indices.long().cpu(),
            "last": [int(x) for x in kv_last_page_len.tolist()],
            "group": num_qo_heads // num_kv_heads,
            "page_size": page_size,
            "causal": causal,
            "window_left": window_left,
            "sm_scale": sm_scale,
            "cap": logits_soft_cap or 0.0,
        }

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: tuple[torch.Tensor, torch.Tensor],
        *,
        out: torch.Tensor | None = None,
        return_lse: bool = False,
        window_left: int | None = None,
    ) -> Any:
        plan = self._plan
        if plan is None:
            raise RuntimeError("run() before plan()")
        if window_left is not None and window_left != plan["window_left"]:
            raise AssertionError("window_left differs from the planned one")  # as FlashInfer asserts
        k_cache, v_cache = paged_kv_cache
        page = plan["page_size"]
        scale = plan["sm_scale"] if plan["sm_scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
        result = torch.zeros(q.shape, dtype=torch.float32)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32)
        qo, kv = plan["qo_indptr"], plan["kv_indptr"]
        for i in range(len(qo) - 1):
            rows = range(qo[i], qo[i + 1])
            pages = plan["kv_indices"][kv[i] : kv[i + 1]]
            kv_len = (len(pages) - 1) * page + plan["last"][i] if len(pages) else 0
            if not rows or not kv_len:
                continue
            keys = k_cache[pages].float().flatten(0, 1)[:kv_len].repeat_interleave(plan["group"], 1)
            values = v_cache[pages].float().flatten(0, 1)[:kv_len].repeat_interleave(plan["group"], 1)
            queries = q[qo[i] : qo[i + 1]].float()
            scores = torch.einsum("nhd,khd->hnk", queries, keys) * scale
            if plan["cap"]:
                scores = plan["cap"] * torch.tanh(scores / plan["cap"])
            position = torch.arange(kv_len - len(rows), kv_len)[:, None]
            key = torch.arange(kv_len)[None, :]
            visible = torch.ones(len(rows), kv_len, dtype=torch.bool)
            if plan["causal"]:
                visible &= key <= position
            if plan["window_left"] >= 0:
                visible &= key >= position - plan["window_left"]
            scores = scores.masked_fill(~visible, float("-inf"))
            row_lse = torch.logsumexp(scores, -1)  # [heads, rows]
            weights = torch.exp(scores - row_lse[..., None]).nan_to_num(0.0)
            result[qo[i] : qo[i + 1]] = torch.einsum("hnk,khd->nhd", weights, values)
            lse[qo[i] : qo[i + 1]] = (row_lse / math.log(2)).T
        o = result.to(q.dtype)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, lse) if return_lse else o


class BatchPrefillWithPagedKVCacheWrapper(_PagedAttention):
    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal: bool = False,
        window_left: int = -1,
        sm_scale: float | None = None,
        logits_soft_cap: float | None = None,
        **ignored: Any,
    ) -> None:
        self._set_plan(
            [int(x) for x in qo_indptr.tolist()],
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            page_size,
            causal,
            window_left,
            sm_scale,
            logits_soft_cap,
        )


class BatchDecodeWithPagedKVCacheWrapper(_PagedAttention):
    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        window_left: int = -1,
        sm_scale: float | None = None,
        logits_soft_cap: float | None = None,
        **ignored: Any,
    ) -> None:
        # one query row per sequence, the last position of its KV
        self._set_plan(
            list(range(len(indptr))),
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            page_size,
            True,
            window_left,
            sm_scale,
            logits_soft_cap,
        )

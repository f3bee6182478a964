"""Parameters that know how to load their shard: every parameter of :mod:`minisgl_core.layers`
carries ``weight_loader(param, full_tensor, shard_id=None)`` and ``shard_ids`` (the shard ids a
complete load needs; fused layers are loaded from several checkpoint tensors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

WeightLoader = Callable[[nn.Parameter, torch.Tensor, Any], None]


def new_param(
    shape: tuple[int, ...],
    dtype: torch.dtype | None,
    device: Any,
    loader: WeightLoader,
    shard_ids: tuple[Any, ...] = (None,),
) -> nn.Parameter:
    param = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
    param.weight_loader = loader  # type: ignore[attr-defined]
    # the shard ids a full load needs (fused layers are loaded from several checkpoint tensors)
    param.shard_ids = shard_ids  # type: ignore[attr-defined]
    return param


def copy_shard(param: nn.Parameter, shard: torch.Tensor) -> None:
    if param.shape != shard.shape:
        raise ValueError(
            f"checkpoint shard of shape {tuple(shard.shape)} does not fit parameter {tuple(param.shape)}"
        )
    param.data.copy_(shard)


def load_full(param: nn.Parameter, loaded: torch.Tensor, shard_id: Any = None) -> None:
    """The weight loader of a replicated parameter: every rank keeps the whole tensor."""
    copy_shard(param, loaded)


def copy_rows(dest: torch.Tensor, loaded: torch.Tensor, start: int, full_rows: int) -> None:
    """Copy rows ``start : start + len(dest)`` of ``loaded``, which must have ``full_rows`` rows."""
    if loaded.shape[0] != full_rows or dest.shape[1:] != loaded.shape[1:]:
        raise ValueError(
            f"checkpoint tensor of shape {tuple(loaded.shape)} does not fit: expected {full_rows} rows"
            f" of shape {tuple(dest.shape[1:])}"
        )
    dest.copy_(loaded.narrow(0, start, dest.shape[0]))

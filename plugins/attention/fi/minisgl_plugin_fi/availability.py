"""Cheap "can this backend run here?" checks shared by the GPU attention plugins (fi, fa3).

Nothing here imports a kernel library or creates a CUDA context beyond what
``torch.cuda.is_available()`` and ``torch.cuda.get_device_capability()`` do.
"""

from __future__ import annotations

import importlib.util

import torch


def module_installed(name: str) -> bool:
    """True when ``import name`` would find the module (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # A half-installed parent package or a module with a None __spec__ counts as absent.
        return False


def cuda_unavailable_reason(
    device: torch.device | str,
    *,
    backend: str,
    min_capability: tuple[int, int],
    only_major: int | None = None,
) -> str | None:
    """``None`` when ``device`` is a CUDA GPU with at least ``min_capability`` (and, when
    ``only_major`` is given, exactly that major version), else one line saying why not."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the {backend} attention backend runs on CUDA GPUs only, not on {device.type!r}"
    if not torch.cuda.is_available():
        return f"the {backend} attention backend needs a CUDA GPU, but torch.cuda.is_available() is False"
    major, minor = torch.cuda.get_device_capability(device)
    wanted = f"sm{only_major}x" if only_major is not None else f"sm{min_capability[0]}{min_capability[1]}+"
    if (major, minor) < min_capability or (only_major is not None and major != only_major):
        return f"the {backend} attention backend needs a {wanted} GPU; this one is sm{major}{minor}"
    return None

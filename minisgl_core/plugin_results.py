"""What the core raises when a selected plugin's method returns what the API does not allow (an
attention backend's ``forward`` a tensor of another shape, a cache's ``insert_prefix`` a list).
The core used to read such a value anyway and fail in its own code (a reshape, ``.numel()``), with
no plugin named; the engine names the plugin of :attr:`WrongResult.owner`
(engine/plugin_failures.py), as it names one that raises."""

from __future__ import annotations

from typing import Any

import torch


class WrongResult(TypeError):
    """``owner``'s method returned a value the core cannot use; ``kind`` is the owner's registry
    kind ("attention", "caches"). The message reads ``Class.method returned X, expected Y``."""

    def __init__(self, owner: object, kind: str, what: str) -> None:
        super().__init__(f"{type(owner).__name__}.{what}")
        self.owner, self.kind = owner, kind


def shown(value: Any) -> str:
    """What a method returned, as a message says it: a tensor by its dtype and shape (and its
    device, off the CPU), anything else by its type."""
    if not isinstance(value, torch.Tensor):
        return type(value).__name__
    where = "" if value.device.type == "cpu" else f" on {value.device}"
    return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}{where}"

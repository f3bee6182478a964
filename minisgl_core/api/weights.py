"""Weight formats: how a model is stored on disk (API 1.6).

The core reads Hugging Face directories with safetensors weights itself; a plugin registers any
other format (GGUF, ...) with ``minisgl_register_weight_formats``. The core asks every format in
turn whether it recognises the path the user gave (``--model``), then reads the model's config,
tokenizer and weights through the one that does.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WeightFormat(ABC):
    """One model stored in one format; constructed with the path ``detect`` accepted.

    The constructor reads and checks what it cheaply can (headers, metadata, sizes) and raises
    ``ValueError`` with a one-line message naming the file and the problem, so a bad file fails
    before any model is built. Nothing here may keep gigabytes alive: weights stream.

    .. versionadded:: 1.6
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    @abstractmethod
    def detect(cls, path: Path) -> bool:
        """True when ``path`` (a file or a directory) holds a model in this format.

        Cheap and side-effect free: file names and magic bytes only, never a tensor."""

    @abstractmethod
    def hf_config(self) -> dict[str, Any]:
        """The model's config as a Hugging Face ``config.json`` dict, with ``architectures``
        naming one of the registered model classes (``LlamaForCausalLM``) and the token ids
        (``eos_token_id``, ``bos_token_id``) where the format knows them."""

    def generation_config(self) -> dict[str, Any]:
        """Sampling defaults as a ``generation_config.json`` dict; ``{}`` when the format has none."""
        return {}

    @abstractmethod
    def tokenizer(self) -> Any:
        """A ``transformers`` tokenizer for the model, with its chat template when it has one."""

    @abstractmethod
    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight as (Hugging Face checkpoint name, full tensor in ``dtype`` on the CPU),
        one at a time, named as in the model's ``transformers`` checkpoint
        (``model.layers.0.self_attn.q_proj.weight``) so any model plugin can load it."""

    def num_weights(self) -> int | None:
        """How many tensors :meth:`weights` yields, for the progress bar; None when unknown."""
        return None

    @property
    def model_name(self) -> str:
        """The name the server reports for this model (``/v1/models``)."""
        path = self.path.resolve() if self.path.name in ("", "..") else self.path  # (`.`: its folder's)
        return path.stem if path.is_file() else path.name

    def describe(self) -> str:
        """A short line for logs: what is being loaded."""
        return f"{self.path} ({type(self).__name__})"


def layer_count_problem(count: int, found: Iterable[int], *, key: str, prefix: str) -> str | None:
    """What is wrong when the layer indices of a model's tensors (``found``: the N of their names
    ``{prefix}N.*``) are not exactly ``0 .. count - 1``, where ``count`` is what the metadata's
    ``key`` says: the first index missing or the first one too many, or None when they agree.

    The core checks config.json's ``num_hidden_layers`` against ``model.layers.N.*`` with it; a
    weight format checks the layer count of its own metadata against its own tensor names the
    same way (the GGUF plugin: ``{arch}.block_count`` against ``blk.N.*``). A count below the
    tensors' builds a truncated model that loads without a word.

    .. versionadded:: 2.3
    """
    found = set(found)
    # the first index missing is at most len(found): never build range(count), which a file may
    # make 2**32 long
    missing = next(i for i in itertools.count() if i not in found)
    if missing < count:
        return f"{key} {count}, the weights have no {prefix}{missing}.* (they hold {len(found)} layers)"
    extra = sorted(i for i in found if not 0 <= i < count)
    if extra:
        return f"{key} {count}, the weights also hold {prefix}{extra[0]}.* ({len(found)} layers in all)"
    return None

"""The GGUF weight format: one ``.gguf`` file (or a directory holding one) read with ``gguf``.

Everything that can be checked without dequantizing is checked when the file is opened (magic,
complete tensor data, architecture, tensor types), so a bad file fails before a model is built
and nothing is half-loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minisgl_core.api import WeightFormat
from minisgl_plugin_gguf.metadata import (
    UnsupportedGGUF,
    generation_config_from_metadata,
    hf_config_from_metadata,
)
from minisgl_plugin_gguf.names import IGNORED, hf_name, unpermute_qk

MAGIC = b"GGUF"
#: tensor types dequantized at load (by name of ``gguf.GGMLQuantizationType``)
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
#: metadata arrays too large to be worth decoding for the config (the tokenizer reads them itself)
_SKIPPED_FIELDS = frozenset({"tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"})


def find_gguf_file(path: Path) -> Path:
    """``path`` itself, or the one ``.gguf`` file in the directory ``path``."""
    if path.is_file():
        return path
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise ValueError(f"{path} must hold exactly one .gguf file (found: {names}); pass the file itself")
    return found[0]


class GGUFFormat(WeightFormat):
    """A llama.cpp GGUF file: config, tokenizer and chat template from its metadata."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.file = find_gguf_file(self.path)
        self._reader = _open_reader(self.file)
        self.fields = {
            name: field.contents()
            for name, field in self._reader.fields.items()
            if name not in _SKIPPED_FIELDS and not name.startswith("GGUF.")
        }
        names = {tensor.name for tensor in self._reader.tensors}
        self._config = hf_config_from_metadata(self.fields, tied="output.weight" not in names, path=str(self.file))
        _check_tensor_types(self._reader, self.file)

    @classmethod
    def detect(cls, path: Path) -> bool:
        if path.is_dir():
            return any(path.glob("*.gguf"))
        if not path.is_file():
            return False
        with open(path, "rb") as handle:
            return handle.read(4) == MAGIC

    @property
    def model_name(self) -> str:
        # the cached default model lives in a directory named after it; a bare file is named by its stem
        return self.path.name if self.path.is_dir() else self.file.stem

    def hf_config(self) -> dict[str, Any]:
        return dict(self._config)

    def generation_config(self) -> dict[str, Any]:
        return generation_config_from_metadata(self.fields)

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its GGUF notes ("converting tokenizer...") are not ours to show
        try:
            return AutoTokenizer.from_pretrained(str(self.file.parent), gguf_file=self.file.name)
        finally:
            hf_logging.set_verbosity(verbosity)

    def num_weights(self) -> int | None:
        return sum(1 for tensor in self._reader.tensors if tensor.name not in IGNORED)

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        from gguf.quants import dequantize

        config = self._config
        permuted = config["model_type"] == "llama"
        for tensor in self._reader.tensors:
            if tensor.name in IGNORED:
                continue
            values = np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
            weight = torch.from_numpy(values).reshape(tuple(int(d) for d in reversed(tensor.shape)))
            name = hf_name(tensor.name) or tensor.name  # unknown names reach the core, which reports them
            if permuted and name.endswith("self_attn.q_proj.weight"):
                weight = unpermute_qk(weight, config["num_attention_heads"])
            elif permuted and name.endswith("self_attn.k_proj.weight"):
                weight = unpermute_qk(weight, config["num_key_value_heads"])
            yield name, weight.to(dtype)

    def describe(self) -> str:
        return f"{self.file} (GGUF, {self.fields.get('general.architecture')})"


def _open_reader(file: Path) -> Any:
    from gguf import GGUFReader

    size = file.stat().st_size
    try:
        reader = GGUFReader(str(file))
    except Exception as exc:  # noqa: BLE001 - gguf raises ValueError/IndexError/... on damaged files
        raise ValueError(
            f"{file} is not a readable GGUF file ({type(exc).__name__}: {exc}); it may be truncated or "
            f"corrupt: download it again"
        ) from exc
    for tensor in reader.tensors:
        end = tensor.data_offset + tensor.n_bytes
        if end > size:
            raise ValueError(
                f"{file} is truncated: tensor {tensor.name} ends at byte {end} but the file has {size} bytes; "
                f"download it again"
            )
    return reader


def _check_tensor_types(reader: Any, file: Path) -> None:
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        if type_name not in SUPPORTED_TYPES:
            raise UnsupportedGGUF(
                f"{file}: tensor {tensor.name} has GGUF type {type_name}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_TYPES)}"
            )

"""A fast reader of a GGUF file's header: metadata and tensor table, tensor data memory-mapped.

``gguf.GGUFReader`` builds numpy arrays for every string of the token list and merges (about
100,000 for SmolLM2), which takes seconds on a busy CPU, in every process that opens the model.
This reads the same layout (GGUF v2/v3: magic, counts, key/values, tensor infos, aligned data)
with ``struct`` in a fraction of that; ``gguf`` still does the dequantizing.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types -> struct format (scalars); 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip
_STRING, _ARRAY = 8, 9


class Truncated(ValueError):
    """The file ends before its header (or a tensor) does."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    #: ggml order: dims[0] is the innermost (contiguous) dimension
    dims: tuple[int, ...]
    type_id: int
    #: absolute byte offset of the data in the file
    offset: int
    n_bytes: int


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise Truncated(f"the header ends at byte {len(self.data)}, inside a field")
        value = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        length = self.take("<Q")
        if self.pos + length > len(self.data):
            raise Truncated(f"the header ends at byte {len(self.data)}, inside a string")
        text = bytes(self.data[self.pos : self.pos + length]).decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, type_id: int) -> Any:
        if type_id in _SCALARS:
            return self.take("<" + _SCALARS[type_id])
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            item_type, count = self.take("<I"), self.take("<Q")
            if item_type in _NUMPY:
                size = np.dtype(_NUMPY[item_type]).itemsize * count
                if self.pos + size > len(self.data):
                    raise Truncated(f"the header ends at byte {len(self.data)}, inside an array")
                items = np.frombuffer(self.data, _NUMPY[item_type], count, self.pos).tolist()
                self.pos += size
                return items
            return [self.value(item_type) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {type_id}")


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    fields: dict[str, Any]
    tensors: list[TensorInfo]
    size: int
    #: the whole file, memory-mapped read-only
    data: np.ndarray

    def tensor_bytes(self, tensor: TensorInfo) -> np.ndarray:
        return self.data[tensor.offset : tensor.offset + tensor.n_bytes]


def read_header(path: Path, quant_sizes: dict[int, tuple[int, int]]) -> GGUFHeader:
    """Parse ``path``'s header; ``quant_sizes``: type id -> (block size, bytes per block).

    Raises :class:`Truncated` when the file ends inside the header or any tensor's data, and
    ``ValueError`` for what is not GGUF, or lays out its tensors' data as llama.cpp refuses."""
    if path.stat().st_size < 4:
        raise Truncated(f"the file has {path.stat().st_size} bytes, not even a GGUF magic")
    raw = np.memmap(path, dtype=np.uint8, mode="r")  # pages are read only as they are touched
    data = memoryview(raw)
    if bytes(data[:4]) != MAGIC:
        if bytes(data[:23]) == b"version https://git-lfs":
            raise ValueError("a Git LFS pointer, not the file's data (fetch it: `git lfs pull`)")
        raise ValueError("not a GGUF file (no GGUF magic)")
    cursor = _Cursor(data)
    cursor.pos = 4
    version = cursor.take("<I")
    if version not in (2, 3) and int.from_bytes(version.to_bytes(4, "little"), "big") in (2, 3):
        raise ValueError(
            "the file is big-endian (written for another byte order: its version reads "
            f"{version}); convert a little-endian GGUF of the model"
        )
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
    tensor_count, kv_count = cursor.take("<Q"), cursor.take("<Q")
    fields: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        fields[key] = cursor.value(cursor.take("<I"))
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.take("<I")
        dims = tuple(cursor.take("<Q") for _ in range(n_dims))
        infos.append((name, dims, cursor.take("<I"), cursor.take("<Q")))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or alignment % 8:
        # the format asks for a multiple of 8; zero divided by zero here
        raise ValueError(f"general.alignment is {alignment!r}, not a positive multiple of 8")
    start = -(-cursor.pos // alignment) * alignment
    tensors = []
    for name, dims, type_id, offset in infos:
        if type_id not in quant_sizes:
            raise ValueError(f"tensor {name} has an unknown GGUF type id {type_id}")
        block, type_size = quant_sizes[type_id]
        # (Python's integers: a dimension of 2**63 wrapped numpy's int64 product round to a size
        # that passed the check below, then failed torch's reshape with an overflow)
        n_bytes = math.prod(dims) // block * type_size
        tensor = TensorInfo(name, dims, type_id, start + offset, n_bytes)
        if tensor.offset + n_bytes > len(raw):
            raise Truncated(
                f"tensor {name} ends at byte {tensor.offset + n_bytes} but the file has {len(raw)} bytes"
            )
        tensors.append(tensor)
    _check_layout(tensors, start, alignment)
    return GGUFHeader(path, version, fields, tensors, len(raw), raw)


def _check_layout(tensors: list[TensorInfo], start: int, alignment: int) -> None:
    """Refuse what llama.cpp refuses: a tensor's data offset that is not a multiple of the
    alignment, or data that overlaps another tensor's (both loaded other bytes as the weights)."""
    previous = None
    for tensor in sorted(tensors, key=lambda t: (t.offset, t.n_bytes)):
        if (tensor.offset - start) % alignment:
            raise ValueError(
                f"tensor {tensor.name} has data offset {tensor.offset - start}, not a multiple of "
                f"general.alignment ({alignment})"
            )
        if previous is not None and tensor.offset < previous.offset + previous.n_bytes:
            raise ValueError(
                f"tensor {tensor.name} (data offset {tensor.offset - start}) overlaps tensor "
                f"{previous.name} (data offset {previous.offset - start}, {previous.n_bytes} bytes)"
            )
        previous = tensor

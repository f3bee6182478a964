"""A safetensors file's header, read without torch or the safetensors library.

The file starts with the header's length (8 bytes, little-endian) and a JSON header giving every
tensor's dtype, shape and byte range; so a file cut short (an interrupted copy or download) shows
before a tensor is read, and the shapes can be compared with config.json
(:mod:`minisgl_core.checkpoint.integrity`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

#: bytes per element of the safetensors dtypes (the sub-byte ones are left unchecked)
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
FLOAT_DTYPES = {"F8_E5M2", "F8_E4M3", "F16", "BF16", "F32", "F64"}
INTEGER_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"}
#: the safetensors library refuses larger headers, so a larger length is garbage, not a header
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    file: str


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors a safetensors file's header lists; a ValueError naming the file when the header
    is unreadable or promises bytes the file does not have."""
    broken = f"{path.name} is truncated or corrupt"
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 8:
            raise ValueError(f"{broken}: {size} bytes, too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > min(size - 8, MAX_HEADER_BYTES):
            raise ValueError(
                f"{broken}: its header length field says {header_len:,} bytes, the file has {size:,}"
            )
        raw = f.read(header_len)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{broken}: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{broken}: its header is not a JSON object")
    data_bytes = size - 8 - header_len
    tensors: dict[str, TensorEntry] = {}
    ranges: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not all(isinstance(v, int) for v in (begin, end, *shape)) or not 0 <= begin <= end:
                raise TypeError
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{broken}: its header's entry for {name} is malformed") from None
        width = DTYPE_BYTES.get(dtype)
        if width is not None and _product(shape) * width != end - begin:
            raise ValueError(
                f"{broken}: tensor {name} ({dtype}, shape {list(shape)}) is given {end - begin:,} bytes, "
                f"not {_product(shape) * width:,}"
            )
        ranges.append((begin, end, name))
        tensors[name] = TensorEntry(dtype, shape, path.name)
    ranges.sort()
    past_end = [name for _, end, name in ranges if end > data_bytes]
    if past_end:
        lie = (
            f"{past_end[0]} and {len(past_end) - 1} more lie" if len(past_end) > 1 else f"{past_end[0]} lies"
        )
        raise ValueError(
            f"{broken}: the header needs {8 + header_len + ranges[-1][1]:,} bytes, the file has {size:,} "
            f"({lie} past its end; an interrupted copy or download?)"
        )
    # the safetensors library refuses gaps, overlaps and trailing bytes: the same words here
    covered = 0
    for begin, end, name in ranges:
        if begin != covered:
            raise ValueError(f"{broken}: tensor {name} starts at data byte {begin:,}, not {covered:,}")
        covered = end
    if covered != data_bytes:
        raise ValueError(f"{broken}: {data_bytes - covered:,} bytes follow its last tensor")
    return tensors


def _product(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total

"""Dequantizing a GGUF file's tensors into PyTorch tensors: the one part of the plugin that needs
torch, kept apart so that opening a file (its config, its tokenizer) does not import it: the
server's tokenizer and detokenizer processes open the model too, and never read its weights."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch

from minisgl_plugin_gguf.header import GGUFHeader, TensorInfo


def dequantize_tensor(header: GGUFHeader, tensor: TensorInfo, dtype: torch.dtype) -> torch.Tensor:
    """The tensor as ``dtype`` in PyTorch's shape (ggml dims reversed), a tensor of its own (the map
    is read-only). Exactly ``gguf.quants.dequantize``'s float32 values cast to ``dtype``: the stored
    float types are cast straight to it (float16 and bfloat16 widen to float32 exactly; PyTorch
    quiets a signalling NaN, which NumPy keeps, and the loader refuses a NaN weight anyway); the
    block formats of :data:`_BLOCK_FORMATS` (Q8_0, Q4_0, Q4_1 and the K-quants Q2_K to Q6_K) in
    PyTorch, a chunk of blocks at a time, the same float32 operations as gguf's; every other type
    through ``gguf.quants.dequantize`` itself."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(tensor.type_id)
    shape = tuple(reversed(tensor.dims))
    raw = header.tensor_bytes(tensor)
    stored = _FLOAT_TYPES.get(qtype.name)
    if stored is not None:
        return _as_tensor(raw).view(stored).reshape(shape).to(dtype, copy=True)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype.name in _BLOCK_FORMATS:
        blocks = _as_tensor(raw).reshape(-1, type_size)
        return _dequantize_blocks(qtype.name, blocks, block, dtype).reshape(shape)
    blocks = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
    values = np.ascontiguousarray(dequantize(blocks, qtype), dtype=np.float32).reshape(shape)
    return torch.from_numpy(values).to(dtype)


#: the float types a file stores as they are, by name of ``gguf.GGMLQuantizationType``
_FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def _as_tensor(raw: np.ndarray) -> torch.Tensor:
    """The mapped bytes ``raw`` as a uint8 tensor sharing them: only read, never written, so
    PyTorch's warning that the array is not writable does not apply."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(raw)


#: weights dequantized at a time: their float32 values (8 MiB) stay in the CPU's cache through the
#: steps that make them, and only the result in the asked dtype goes out to memory. A 4096 x 14336
#: Q4_1 tensor to bfloat16 took 21 ms so on a 16-core host (the GPU machine's), 37 ms all blocks at
#: once, 270 ms in NumPy; 4,096 or 16,384 blocks of 32 a chunk were slower (more steps, each
#: starting PyTorch's threads)
_CHUNK_WEIGHTS = 65536 * 32


def _dequantize_blocks(
    type_name: str, blocks: torch.Tensor, weights: int, dtype: torch.dtype
) -> torch.Tensor:
    """``blocks`` (``[n, bytes a block]`` uint8) of ``type_name`` (one of :data:`_BLOCK_FORMATS`),
    ``weights`` a block, as ``[n, weights]`` of ``dtype``: the float32 values, cast."""
    count = blocks.shape[0]
    out = torch.empty(count, weights, dtype=dtype)
    step = max(1, _CHUNK_WEIGHTS // weights)
    rows = min(count, step)
    values = out if dtype == torch.float32 else torch.empty(rows, weights)
    scratch = torch.empty(2, rows, weights, dtype=torch.uint8)
    with _free_threads():
        for start in range(0, count, step):
            chunk = blocks[start : start + step]
            size = chunk.shape[0]
            target = values[start : start + size] if values is out else values[:size]
            _dequantize_chunk(type_name, chunk, target, scratch[:, :size])
            if values is not out:
                out[start : start + size].copy_(target)
    return out


@contextmanager
def _free_threads() -> Iterator[None]:
    """PyTorch's intra-op threads, while dequantizing, limited to the cores other programs leave
    free (:func:`free_cores`); the process's own setting restored after.

    Each step on PyTorch's threads waits at its end for the slowest of them, and on a CPU busy with
    other programs one may be off its core for a whole time slice: on the 2-core dev CPU at load
    2-3, two threads took 1.1-1.4 s for a 4096 x 14336 Q4_1 tensor that one thread dequantizes in
    0.14 s, and the default model loaded in 1.3-10 s instead of 0.25-0.8 (BENCHMARKS.md, "GGUF
    dequantization on the cores left free")."""
    threads = torch.get_num_threads()
    wanted = min(threads, free_cores())
    if wanted == threads:
        yield
        return
    torch.set_num_threads(wanted)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def free_cores() -> int:
    """The cores this process may run on less the busy ones, by the 1-minute load average
    (rounded), at least 1; all of them where the system gives no load average."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, cores - round(load))


def _dequantize_chunk(type_name: str, blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """:func:`_dequantize_blocks` of a chunk: ``blocks`` into ``out`` (float32 ``[n, weights a
    block]``), in place; ``scratch``: room for the integer weights (uint8 ``[2, n, weights]``)."""
    _BLOCK_FORMATS[type_name](blocks, out, scratch)


def _float16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The float16 stored at byte ``at`` of each block, as float32 ``[n, 1]``."""
    return blocks[:, at : at + 2].view(torch.float16).float()


def _unpack(packed: torch.Tensor, bits: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The ``bits``-bit fields of ``packed`` (uint8 ``[n, groups, width]``, ``width`` a multiple
    of 4) into ``out`` (contiguous uint8 ``[n, groups * 8 // bits * width]``, made if not given):
    per group, the lowest field of each byte, then the next.

    Four bytes at a time, as int32 words (PyTorch's uint8 shifts were 2-3 times slower): a shift
    moves each byte's fields down within it, and the mask drops what came from the byte above."""
    n, groups, width = packed.shape
    if out is None:
        out = torch.empty(n, groups * 8 // bits * width, dtype=torch.uint8)
    words = _words(packed)
    fields = out.view(n, groups, 8 // bits, width).view(torch.int32)
    mask = ((1 << bits) - 1) * 0x01010101
    for field, shift in enumerate(range(0, 8, bits)):
        torch.bitwise_and(words >> shift, mask, out=fields[:, :, field])
    return out


def _words(packed: torch.Tensor) -> torch.Tensor:
    """``packed`` (uint8, its last dimension a multiple of 4) as int32 words: a copy where its
    bytes do not start on a word or a row is not a whole number of words. A slice of one block is
    contiguous whatever its offset and row stride (a dimension of size 1 has no stride to keep):
    a tensor or a last chunk of one Q4_0 or Q3_K block failed to view as words."""
    aligned = (
        packed.is_contiguous()
        and packed.storage_offset() % 4 == 0
        and all(stride % 4 == 0 for stride in packed.stride()[:-1])
    )
    if not aligned:
        packed = torch.empty(packed.shape, dtype=torch.uint8).copy_(packed)
    return packed.view(torch.int32)


def _or_shifted(q: torch.Tensor, high: torch.Tensor, shift: int) -> torch.Tensor:
    """``q |= high << shift`` for contiguous uint8 ``q`` and ``high`` whose values stay in a byte
    shifted: as int32 words, as :func:`_unpack`."""
    q.view(torch.int32).bitwise_or_(high.view(torch.int32).bitwise_left_shift_(shift))
    return q


def _scaled(out: torch.Tensor, scales: torch.Tensor, minimums: torch.Tensor | None = None) -> None:
    """``out`` (the integer weights ``q``, float32 ``[n, weights]``) made ``scales * q - minimums``
    in place as gguf computes it (``scales`` and ``minimums`` float32 ``[n, groups]``, one for each
    equal group of a block's weights). The subtraction is written ``-minimums + (scales * q)``:
    the same value bit for bit, zeros' signs included, and where both are NaN PyTorch's add keeps
    the second's NaN as NumPy's ``a - b`` keeps ``a``'s (``torch.sub`` kept ``b``'s); ``-minimums``
    is ``minimums`` times -1, which keeps a NaN's sign (``neg`` flipped it)."""
    n, groups = scales.shape
    grouped = out.view(n, groups, -1)
    grouped.mul_(scales.unsqueeze(-1))
    if minimums is not None:
        torch.add(minimums.mul(-1.0).unsqueeze(-1), grouped, out=grouped)


def _q8_0(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """A float16 scale ``d``, then 32 int8 weights: ``d * q``."""
    out.copy_(blocks[:, 2:].view(torch.int8)).mul_(_float16(blocks, 0))


def _q4_0(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """``d``, then 16 bytes of two 4-bit weights (weights 0-15 the low nibbles, 16-31 the high):
    ``d * (q - 8)``."""
    q = _unpack(blocks[:, None, 2:], 4, scratch[0])
    out.copy_(q).sub_(8).mul_(_float16(blocks, 0))


def _q4_1(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """``d``, a float16 minimum ``m``, then nibbles as Q4_0's: ``d * q + m``."""
    q = _unpack(blocks[:, None, 4:], 4, scratch[0])
    # written m + (d * q): where both are NaN, PyTorch's add then keeps d * q's NaN, as gguf's
    # (d * q) + m does; out.add_(m) kept m's (the test compares the bits)
    torch.add(_float16(blocks, 2), out.copy_(q).mul_(_float16(blocks, 0)), out=out)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's 6-bit scales and minimums of the 8 groups of 32, float32 ``[n, 8]`` each,
    from 12 bytes: bytes 0-3 and 4-7 hold the low 6 bits of scales 0-3 and minimums 0-3, their
    top 2 bits the top of scales 4-7 and minimums 4-7, whose low 4 bits are bytes 8-11's nibbles."""
    low, high, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 0x3F, (rest & 0x0F) | ((low >> 2) & 0x30)], dim=1)
    minimums = torch.cat([high & 0x3F, (rest >> 4) | ((high >> 2) & 0x30)], dim=1)
    return scales.float(), minimums.float()


def _q4_k(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """256 weights: ``d``, ``dmin`` (float16), 12 bytes of packed scales and minimums, then 128
    bytes of 4-bit weights, 32 bytes to two groups of 32 (their low nibbles, then their high):
    ``(d * scale) * q - (dmin * minimum)``."""
    scales, minimums = _k_scales(blocks[:, 4:16])
    q = _unpack(blocks[:, 16:].view(-1, 4, 32), 4, scratch[0])
    _scaled(out.copy_(q), _float16(blocks, 0) * scales, _float16(blocks, 2) * minimums)


def _q5_k(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """Q4_K's with 32 bytes of fifth bits after the scales: group ``j``'s are bit ``j`` of them."""
    scales, minimums = _k_scales(blocks[:, 4:16])
    q = _unpack(blocks[:, 48:].view(-1, 4, 32), 4, scratch[0])
    _or_shifted(q, _unpack(blocks[:, None, 16:48], 1, scratch[1]), 4)
    _scaled(out.copy_(q), _float16(blocks, 0) * scales, _float16(blocks, 2) * minimums)


def _q6_k(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """256 weights in two halves: 128 bytes of their low 4 bits (64 bytes a half: their low
    nibbles, then their high), 64 bytes of their top 2 bits (32 bytes a half, lowest bits first),
    16 int8 scales of groups of 16, then ``d``: ``(d * scale) * (q - 32)``."""
    q = _unpack(blocks[:, :128].view(-1, 2, 64), 4, scratch[0])
    _or_shifted(q, _unpack(blocks[:, 128:192].view(-1, 2, 32), 2, scratch[1]), 4)
    out.copy_(q).sub_(32)  # (exact: q - 32 in float32 is gguf's int8 q - 32)
    _scaled(out, _float16(blocks, 208) * blocks[:, 192:208].view(torch.int8).float())


def _q2_k(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """256 weights: 16 bytes of 4-bit scales (low nibble) and minimums (high) of groups of 16, 64
    bytes of 2-bit weights (32 bytes to 128 weights, lowest bits first), ``d``, ``dmin``:
    ``(d * scale) * q - (dmin * minimum)``."""
    packed = blocks[:, :16]
    q = _unpack(blocks[:, 16:80].view(-1, 2, 32), 2, scratch[0])
    _scaled(
        out.copy_(q),
        _float16(blocks, 80) * (packed & 0x0F).float(),
        _float16(blocks, 82) * (packed >> 4).float(),
    )


def _q3_k(blocks: torch.Tensor, out: torch.Tensor, scratch: torch.Tensor) -> None:
    """256 weights: 32 bytes of third bits (group ``j`` of 32 bit ``j``), 64 bytes of low 2 bits
    (as Q2_K's), 12 bytes of 6-bit scales of groups of 16 (bytes 0-7's nibbles their low 4 bits,
    bytes 8-11's pairs of bits their top 2), ``d``: ``(d * (scale - 32)) * q``, ``q`` the low 2
    bits less 4 where the third bit is clear (``(low | third << 2) - 4``)."""
    packed = blocks[:, 96:108]
    low = _unpack(packed[:, None, :8], 4)
    high = _unpack(packed[:, None, 8:], 2)
    scales = _or_shifted(low, high, 4).float().sub_(32)
    q = _unpack(blocks[:, 32:96].view(-1, 2, 32), 2, scratch[0])
    _or_shifted(q, _unpack(blocks[:, None, :32], 1, scratch[1]), 2)
    out.copy_(q).sub_(4)
    _scaled(out, _float16(blocks, 108) * scales)


#: the block formats dequantized here with PyTorch's threads, a chunk of blocks at a time (by name
#: of ``gguf.GGMLQuantizationType``, each to its function above): the 32-weight Q8_0, Q4_0 and
#: Q4_1, and the K-quants (256-weight super-blocks) of most real files: a Q4_K_M file is mostly
#: Q4_K and Q6_K, a Q5_K_M one Q5_K and Q6_K. ``gguf``'s ``dequantize`` takes them a group of rows
#: at a time in NumPy, on one core (1.2 s for the default model's 211 block tensors on the dev CPU;
#: NumPy over all blocks at once 0.84 s, this 0.53: BENCHMARKS.md, "GGUF blocks dequantized in
#: PyTorch"; a 4096 x 14336 Q4_K tensor 0.40 s, this 0.14 on one core: "GGUF K-quants dequantized
#: in PyTorch"); the same float32 operations in the same order, so bitwise equal to it
#: (tests/test_gguf.py). The other types (Q5_0, Q5_1, the i-quants, ...) go through gguf's NumPy.
_BLOCK_FORMATS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1,
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k, "Q2_K": _q2_k, "Q3_K": _q3_k,
}  # fmt: skip

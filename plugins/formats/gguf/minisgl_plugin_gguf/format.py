"""The GGUF weight format: one ``.gguf`` file (or a directory holding one).

Everything that can be checked without dequantizing is checked when the file is opened (magic,
complete tensor data, architecture, tensor types), so a bad file fails before a model is built
and nothing is half-loaded. ``gguf`` (llama.cpp's package) dequantizes; transformers builds the
tokenizer from the file once, and the result is cached so the other processes load it quickly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from minisgl_core.api import WeightFormat, layer_count_problem
from minisgl_plugin_gguf.header import GGUFHeader, TensorInfo, Truncated, read_header
from minisgl_plugin_gguf.metadata import (
    GEMMA_ARCHITECTURES,
    UnsupportedGGUF,
    check_tokenizer_metadata,
    generation_config_from_metadata,
    hf_config_from_metadata,
)
from minisgl_plugin_gguf.names import (
    GEMMA_NORM_SHIFT,
    IGNORED,
    LONGROPE_FACTORS,
    ROPE_FREQS,
    hf_name,
    unpermute_qk,
)
from minisgl_plugin_gguf.rope_factors import llama3_scaling_from_factors

MAGIC = b"GGUF"
#: tensor types dequantized at load (by name of ``gguf.GGMLQuantizationType``): every weight type
#: ``gguf.quants`` dequantizes. llama.cpp mixes them in one file: a Q4_K_M file stores rows that are
#: not whole 256-weight super-blocks (Qwen2.5-0.5B's 896 columns) as Q5_0, a Q3_K_M file holds
#: Q3_K, Q4_K, Q5_K and Q6_K tensors, and the i-quants fall back to IQ4_NL the same way
SUPPORTED_TYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4",
)  # fmt: skip


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
        self.header = _read_header(self.file)
        self.fields = self.header.fields
        names = {tensor.name for tensor in self.header.tensors}
        self._config = hf_config_from_metadata(
            self.fields, tied="output.weight" not in names, path=str(self.file)
        )
        _check_tensor_types(self.header, self.file)
        check_tokenizer_metadata(self.fields, str(self.file))
        # what the file states in tensors rather than metadata: biases, llama3 rope scaling
        built = _BUILT_BIASES.get(self._config["model_type"], frozenset())
        if any(_BIAS.get(_part(name)) == "attention_bias" and _part(name) not in built for name in names):
            self._config["attention_bias"] = True
        if any(_BIAS.get(_part(name)) == "mlp_bias" for name in names):
            self._config["mlp_bias"] = True
        factors = next((t for t in self.header.tensors if t.name == ROPE_FREQS), None)
        scaling = None if factors is None else _rope_scaling(self.header, factors, self._config, self.file)
        if scaling is not None:
            self._config["rope_scaling"] = scaling
        if any(name in LONGROPE_FACTORS for name in names):  # (the 128k Phi-3 models)
            # stated as config.json states it, so the core refuses it in its own words: computed
            # without those factors, every position would rotate by other angles
            self._config["rope_scaling"] = {"rope_type": "longrope"}
        embeddings = next((t for t in self.header.tensors if t.name == "token_embd.weight"), None)
        if self._config["model_type"] == "gemma3" and embeddings is not None and len(embeddings.dims) == 2:
            # llama.cpp's converter cuts Gemma 3's embedding rows past the tokenizer's vocabulary
            # (Gemma3Model.modify_tensors: 262144 of config.json's 262208): the table is the vocabulary
            self._config["vocab_size"] = int(embeddings.dims[1])
        _check_head_rows(self.header, self._config, self.file)
        _check_other_sizes(self.header, self._config, self.file)
        _check_block_count(self.header, self._config, self.file)

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
        if not self.path.is_dir():
            return self.file.stem
        return (
            self.path.resolve() if self.path.name in ("", "..") else self.path
        ).name  # (`.`: its folder's)

    def hf_config(self) -> dict[str, Any]:
        return dict(self._config)

    def generation_config(self) -> dict[str, Any]:
        return generation_config_from_metadata(self.fields)

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        cached = _tokenizer_cache_dir(self.file)
        if not (cached / "tokenizer_config.json").is_file():
            try:
                _convert_tokenizer(self.file, cached, self.fields.get("general.architecture"))
            except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
                # (a token or the chat template not UTF-8 was transformers' UnicodeDecodeError,
                # a damaged merge list the tokenizers library's bare Exception: tracebacks)
                reason = str(exc).strip().splitlines()
                raise UnsupportedGGUF(
                    f"{self.file}: its tokenizer could not be built from the file's metadata "
                    f"({type(exc).__name__}: {reason[0] if reason else 'no message'}); the file may "
                    "be damaged: download it again"
                ) from exc
        return AutoTokenizer.from_pretrained(str(cached))

    def num_weights(self) -> int | None:
        return sum(1 for tensor in self.header.tensors if tensor.name not in IGNORED)

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        config = self._config
        permuted = config["model_type"] == "llama"
        shifted = config["model_type"] in GEMMA_ARCHITECTURES
        for tensor in self.header.tensors:
            if tensor.name in IGNORED:
                continue
            if shifted and tensor.name.endswith("norm.weight"):
                # stored as 1 + weight (llama.cpp's converter); our Gemma models add the 1
                weight = _dequantize(self.header, tensor, torch.float32).sub_(GEMMA_NORM_SHIFT).to(dtype)
            else:
                weight = _dequantize(self.header, tensor, dtype)
            name = hf_name(tensor.name, config["model_type"]) or tensor.name  # the core reports unknown ones
            # llama.cpp's converter permutes the biases of q and k with their rows
            if permuted and name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
                weight = unpermute_qk(weight, config["num_attention_heads"])
            elif permuted and name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
                weight = unpermute_qk(weight, config["num_key_value_heads"])
            yield name, weight

    def describe(self) -> str:
        return f"{self.file} (GGUF, {self.fields.get('general.architecture')})"


#: the config.json flag a block's bias tensor needs (our models build them from the flags)
_BIAS = {
    **{f"{part}.bias": "attention_bias" for part in ("attn_q", "attn_k", "attn_v", "attn_output")},
    **{f"{part}.bias": "mlp_bias" for part in ("ffn_gate", "ffn_up", "ffn_down")},
}


#: biases an architecture's model has whatever its config says (Qwen2's q, k and v): they need no flag,
#: and attention_bias would give o_proj one too
_BUILT_BIASES = {"qwen2": frozenset({"attn_q.bias", "attn_k.bias", "attn_v.bias"})}


def _part(name: str) -> str:
    """``attn_q.bias`` of ``blk.3.attn_q.bias``."""
    return name.split(".", 2)[-1] if name.startswith("blk.") else name


def _rope_scaling(
    header: GGUFHeader, tensor: TensorInfo, config: dict[str, Any], file: Path
) -> dict[str, Any] | None:
    """config.json's llama3 ``rope_scaling`` for the file's ``rope_freqs.weight`` (None when every
    divisor is 1): llama.cpp's converter stores Llama 3.1's scaling as one divisor per rotary
    frequency, not as metadata."""
    heads, head_dim = config["num_attention_heads"], config.get("head_dim")
    if not isinstance(heads, int) or heads <= 0 or (head_dim is not None and not isinstance(head_dim, int)):
        return None  # the core's check of the config's values names the bad one
    head_dim = head_dim or config["hidden_size"] // heads
    factors = _dequantize(header, tensor, torch.float64).reshape(-1).numpy()
    if factors.size != head_dim // 2:
        raise UnsupportedGGUF(
            f"{file}: {ROPE_FREQS} has {factors.size} values, the rotary dimension {head_dim} needs {head_dim // 2}"
        )
    if np.all(factors == 1.0):
        return None
    if config.get("rope_scaling") is not None:
        raise UnsupportedGGUF(
            f"{file}: both {ROPE_FREQS} and rope scaling metadata; which applies is unclear"
        )
    scaling = llama3_scaling_from_factors(factors, float(config.get("rope_theta", 10000.0)), head_dim)
    if scaling is None:
        raise UnsupportedGGUF(
            f"{file}: {ROPE_FREQS} holds per-frequency rotary factors that are not Llama 3's rope "
            "scaling; other rotary factors are not supported"
        )
    return scaling


def _check_head_rows(header: GGUFHeader, config: dict[str, Any], file: Path) -> None:
    """q/k/v rows against the head counts the metadata states, named in its keys (the llama
    architecture's un-permuting of q and k otherwise failed with a reshape error)."""
    arch = config["model_type"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    sizes = (heads, kv_heads, config["hidden_size"], config.get("head_dim", 1))
    if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
        return  # the core's check of the config's values names the bad one
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    head_key = (
        f"{arch}.attention.key_length" if "head_dim" in config else f"{arch}.embedding_length / head_count"
    )
    wanted = {
        "attn_q": (heads * head_dim, f"{arch}.attention.head_count ({heads}) x {head_key} ({head_dim})"),
        "attn_k": (
            kv_heads * head_dim,
            f"{arch}.attention.head_count_kv ({kv_heads}) x {head_key} ({head_dim})",
        ),
        "attn_v": (
            kv_heads * head_dim,
            f"{arch}.attention.head_count_kv ({kv_heads}) x {head_key} ({head_dim})",
        ),
        "attn_qkv": (
            (heads + 2 * kv_heads) * head_dim,
            f"({arch}.attention.head_count ({heads}) + 2 x head_count_kv ({kv_heads})) x {head_key} ({head_dim})",
        ),
    }
    for tensor in header.tensors:
        part = _part(tensor.name).split(".")[0]
        if part in wanted and tensor.dims and tensor.dims[-1] != wanted[part][0]:
            rows, keys = wanted[part]
            raise UnsupportedGGUF(
                f"{file}: tensor {tensor.name} has {tensor.dims[-1]} rows, the metadata's {keys} "
                f"makes {rows}: the metadata does not describe these weights"
            )


def _check_other_sizes(header: GGUFHeader, config: dict[str, Any], file: Path) -> None:
    """The vocabulary's rows and the MLPs' inner size against the metadata, before the model is
    built from it: the model's tables are sized by the metadata, so a count of 2**31 asked the
    allocator for terabytes (a bare allocation error) where a small one was named at load."""
    arch = config["model_type"]
    sizes = {
        "token_embd": (-1, "vocab_size", f"{arch}.vocab_size (or the tokenizer's token count)"),
        "output": (-1, "vocab_size", f"{arch}.vocab_size (or the tokenizer's token count)"),
        "ffn_down": (0, "intermediate_size", f"{arch}.feed_forward_length"),
    }
    if "moe_intermediate_size" in config:
        sizes["ffn_down_exps"] = (0, "moe_intermediate_size", f"{arch}.expert_feed_forward_length")
    else:  # (Mixtral: llama experts sized by feed_forward_length)
        sizes["ffn_down_exps"] = (0, "intermediate_size", f"{arch}.feed_forward_length")
    for tensor in header.tensors:
        part, _, kind = _part(tensor.name).partition(".")
        if part not in sizes or kind != "weight" or len(tensor.dims) < 2:
            continue  # (a bias has one size)
        axis, config_key, metadata_key = sizes[part]
        want = config.get(config_key)
        if not isinstance(want, int) or isinstance(want, bool) or want <= 0:
            continue  # the core's check of the config's values names the bad one
        if int(tensor.dims[axis]) != want:
            what = "rows" if axis == -1 else "columns"
            raise UnsupportedGGUF(
                f"{file}: tensor {tensor.name} has {tensor.dims[axis]} {what}, the metadata's "
                f"{metadata_key} makes {want}: the metadata does not describe these weights"
            )


def _check_block_count(header: GGUFHeader, config: dict[str, Any], file: Path) -> None:
    """The blocks ``{arch}.block_count`` counts against the file's ``blk.N.*`` tensors, as the core
    checks config.json's num_hidden_layers (a smaller count loaded a truncated model silently)."""
    layers, key = config["num_hidden_layers"], f"{config['model_type']}.block_count"
    if not isinstance(layers, int) or isinstance(layers, bool):
        return  # the core's check of the config's values names the bad one
    found = {int(m.group(1)) for t in header.tensors if (m := re.match(r"blk\.(\d+)\.", t.name))}
    problem = layer_count_problem(layers, found, key=key, prefix="blk.") if found else None
    if problem:
        raise UnsupportedGGUF(
            f"{file}: the metadata says {problem}: the metadata does not describe these weights"
        )


def _quant_sizes() -> dict[int, tuple[int, int]]:
    from gguf import GGML_QUANT_SIZES

    return {int(qtype): sizes for qtype, sizes in GGML_QUANT_SIZES.items()}


#: headers read by this process, by file and its size and modification time: a model is opened
#: several times a start (the command line's checks, generation defaults, the tokenizer, the
#: runner), and parsing the default model's header (its 100,000 vocabulary strings) takes
#: 0.4-0.8 s on the dev CPU each time
_HEADERS: dict[tuple[str, int, int], GGUFHeader] = {}


def _read_header(file: Path) -> GGUFHeader:
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HEADERS:
        _HEADERS.clear()  # one model a process: keep no other file mapped
        _HEADERS[key] = _parse_header(file)
    return _HEADERS[key]


def _parse_header(file: Path) -> GGUFHeader:
    try:
        return read_header(file, _quant_sizes())
    except Truncated as exc:
        raise ValueError(f"{file} is truncated: {exc}; download it again") from exc
    except ValueError as exc:
        raise ValueError(f"{file} is not a readable GGUF file: {exc}") from exc


def _type_name(type_id: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type id {type_id}"


def _check_tensor_types(header: GGUFHeader, file: Path) -> None:
    sizes = _quant_sizes()
    for tensor in header.tensors:
        type_name = _type_name(tensor.type_id)
        if type_name not in SUPPORTED_TYPES:
            raise UnsupportedGGUF(
                f"{file}: tensor {tensor.name} has GGUF type {type_name}, which is not supported; "
                f"supported: {', '.join(SUPPORTED_TYPES)}"
            )
        # A row of a block type is whole blocks: the header's size check rounds down, so such a
        # file opened, and its load failed on a reshape, blamed on the tensor before this one
        block = sizes[tensor.type_id][0]
        if tensor.dims and tensor.dims[0] % block:
            raise UnsupportedGGUF(
                f"{file}: tensor {tensor.name} has GGUF type {type_name} with rows of {tensor.dims[0]} "
                f"values, not whole blocks of {block}: the file is damaged; download or convert it again"
            )


def _dequantize(header: GGUFHeader, tensor: TensorInfo, dtype: torch.dtype) -> torch.Tensor:
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


#: what each cached tokenizer records of its source, so a later conversion can tell a stale entry
SOURCE_RECORD = "minisgl-source.json"


def _source_key(file: Path) -> dict[str, Any]:
    """What a converted tokenizer depends on: the file's identity and transformers' version."""
    import transformers

    stat = file.stat()
    return {
        "file": str(file.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def _tokenizer_cache_dir(file: Path) -> Path:
    """Where the tokenizer built from ``file`` is kept: keyed by :func:`_source_key`."""
    source = _source_key(file)
    key = f"{source['file']}|{source['size']}|{source['mtime_ns']}|{source['transformers']}"
    # the core's cache directory ($MINISGL_CACHE_DIR, else ~/.cache/minisgl), where it keeps models too
    cache_dir = Path(os.environ.get("MINISGL_CACHE_DIR") or Path.home() / ".cache" / "minisgl")
    return cache_dir / "gguf-tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:20]


def _stale(entry: Path) -> bool:
    """Whether a cached tokenizer can never be used again: its GGUF file is gone or was rewritten.
    (One built by another transformers is kept: two environments may share the cache directory,
    and each would prune the other's.) Entries without a record, from before records, are kept."""
    try:
        source = json.loads((entry / SOURCE_RECORD).read_text())
        file = Path(source["file"])
        if not file.is_file():
            return True
        stat = file.stat()
        return (stat.st_size, stat.st_mtime_ns) != (source["size"], source["mtime_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _prune(cache: Path, keep: Path) -> None:
    """Remove the stale entries of ``cache`` (each under its own lock, so a conversion of it in
    another process is not cut short) but ``keep``: a model file rewritten or deleted, or the
    temporary files of tests, left a tokenizer behind each time, never read again."""
    import fcntl

    for entry in cache.iterdir():
        if entry == keep or not entry.is_dir() or entry.name.startswith(".") or not _stale(entry):
            continue
        lock_path = cache / f"{entry.name}.lock"
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # being converted or pruned by another process
                continue
            shutil.rmtree(entry, ignore_errors=True)
            lock_path.unlink(missing_ok=True)


#: architectures whose tokenizer transformers builds from a GGUF file but whose config it does not
#: read (its ``load_gguf_checkpoint`` raises "not supported yet" for ``gemma``), so AutoTokenizer,
#: which reads the config to pick the class, fails: the class it picks for their successors
#: (``gemma2``, ``gemma3``) builds the same sentencepiece vocabulary
_TOKENIZER_CLASSES = {"gemma": "GemmaTokenizer"}


def _convert_tokenizer(file: Path, target: Path, arch: str | None = None) -> None:
    """Build the tokenizer with transformers (slow: it re-reads the whole vocabulary) and save it
    under ``target``; a lock makes concurrent processes convert once, a rename keeps it whole."""
    import fcntl

    import transformers
    from transformers.utils import logging as hf_logging

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "tokenizer_config.json").is_file():
            return
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its notes on converting the GGUF vocabulary are not ours to show
        try:
            builder = getattr(transformers, _TOKENIZER_CLASSES.get(arch or "", "AutoTokenizer"))
            tokenizer = builder.from_pretrained(str(file.parent), gguf_file=file.name)
        finally:
            hf_logging.set_verbosity(verbosity)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            tokenizer.save_pretrained(str(staging))
            (staging / SOURCE_RECORD).write_text(json.dumps(_source_key(file)))
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _prune(target.parent, keep=target)

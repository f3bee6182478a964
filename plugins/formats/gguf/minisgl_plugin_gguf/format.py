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
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

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

if TYPE_CHECKING:
    import torch

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
            arch = self.fields.get("general.architecture")
            problem, cause = None, None
            if _transformers_without_torch():
                problem = _convert_tokenizer_elsewhere(self.file, cached, arch)
            else:
                try:
                    _convert_tokenizer(self.file, cached, arch)
                except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
                    # (a token or the chat template not UTF-8 was transformers' UnicodeDecodeError,
                    # a damaged merge list the tokenizers library's bare Exception: tracebacks)
                    problem, cause = _conversion_problem(exc), exc
            if problem is not None:
                raise UnsupportedGGUF(
                    f"{self.file}: its tokenizer could not be built from the file's metadata "
                    f"({problem}); the file may be damaged: download it again"
                ) from cause
        return AutoTokenizer.from_pretrained(str(cached))

    def num_weights(self) -> int | None:
        return sum(1 for tensor in self.header.tensors if tensor.name not in IGNORED)

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        import torch

        # (here, not at the top: the server's tokenizer and detokenizer open the file without torch)
        from minisgl_plugin_gguf.dequantize import dequantize_tensor

        config = self._config
        permuted = config["model_type"] == "llama"
        shifted = config["model_type"] in GEMMA_ARCHITECTURES
        for tensor in self.header.tensors:
            if tensor.name in IGNORED:
                continue
            if shifted and tensor.name.endswith("norm.weight"):
                # stored as 1 + weight (llama.cpp's converter); our Gemma models add the 1
                weight = (
                    dequantize_tensor(self.header, tensor, torch.float32).sub_(GEMMA_NORM_SHIFT).to(dtype)
                )
            else:
                weight = dequantize_tensor(self.header, tensor, dtype)
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
    factors = _float_values(header, tensor).astype(np.float64).reshape(-1)
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


def _float_values(header: GGUFHeader, tensor: TensorInfo) -> np.ndarray:
    """The tensor's values as ``gguf.quants.dequantize`` gives them (float32, what
    :func:`~minisgl_plugin_gguf.dequantize.dequantize_tensor` matches bit for bit), in NumPy: read when
    the file is opened, which the text processes do without torch."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(header.tensor_bytes(tensor), GGMLQuantizationType(tensor.type_id))


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


def _conversion_problem(exc: BaseException) -> str:
    """A failed conversion in the words :meth:`GGUFFormat.tokenizer` shows: the error's class and first line."""
    reason = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {reason[0] if reason else 'no message'}"


def _transformers_without_torch() -> bool:
    """Whether this process runs transformers as if torch were absent though it is installed (the
    server's tokenizer and detokenizer: ``minisgl_core.tokenizer.load.import_transformers_without_torch``):
    transformers' GGUF reader, which the conversion uses, refuses to run there."""
    import importlib.util

    from transformers.utils import is_torch_available

    return not is_torch_available() and importlib.util.find_spec("torch") is not None


#: the conversion in a fresh interpreter: its class and first line on stdout when it fails
_CONVERT_ELSEWHERE = """
import sys
from pathlib import Path
from minisgl_plugin_gguf.format import _conversion_problem, _convert_tokenizer
try:
    _convert_tokenizer(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] or None)
except Exception as exc:
    print(_conversion_problem(exc))
    sys.exit(3)
"""


def _convert_tokenizer_elsewhere(file: Path, target: Path, arch: str | None) -> str | None:
    """:func:`_convert_tokenizer` in a child interpreter, with torch (once a file: later starts find
    the result cached); what went wrong, in :func:`_conversion_problem`'s words, or None."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _CONVERT_ELSEWHERE, str(file), str(target), arch or ""],
        capture_output=True,
        text=True,
    )
    if done.returncode == 0:
        return None
    said = done.stdout.strip().splitlines() if done.returncode == 3 else []
    if said:
        return said[-1]
    last = done.stderr.strip().splitlines()
    return f"the converting process exited with code {done.returncode}: {last[-1] if last else 'no message'}"


def _convert_tokenizer(file: Path, target: Path, arch: str | None = None) -> None:
    """Build the tokenizer with transformers (slow: it re-reads the whole vocabulary) and save it
    under ``target``; a lock makes concurrent processes convert once, a rename keeps it whole."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "tokenizer_config.json").is_file():
            return
        # (imported once the lock says there is work: a child interpreter that waited on another
        # process's conversion exits without transformers' and torch's seconds of import)
        import transformers
        from transformers.utils import logging as hf_logging

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

"""Reading a model from disk: the built-in safetensors format and the choice among weight formats.

A Hugging Face directory (config.json, generation_config.json, tokenizer, safetensors weights) is
the core's own format; plugins add others (``minisgl_register_weight_formats``) and
:func:`open_model` picks the one that recognises the path. Weights stream as (checkpoint name,
full tensor) pairs, one tensor at a time, so a model's ``load_weights`` can keep its rank's shard
without the whole checkpoint in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minisgl_core.api.weights import WeightFormat
from minisgl_core.checkpoint.safetensors_header import read_header
from minisgl_core.model_dir import load_generation_config, load_hf_config

if TYPE_CHECKING:  # torch only for annotations: the tokenizer process reads formats without it
    import torch

    from minisgl_core.plugins import Plugins

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

__all__ = [
    "checkpoint_files",
    "iter_checkpoint",
    "load_generation_config",
    "load_hf_config",
    "load_tokenizer_dir",
    "open_model",
]


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files holding the weights: the shards of the index, else ``model.safetensors``."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            files = [model_dir / name for name in dict.fromkeys(weight_map.values())]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"{INDEX_FILE} is corrupt: no weight_map of tensor names to files ({exc!r})"
            ) from None
        missing = [path.name for path in files if not path.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shard(s) that do not exist: {', '.join(missing)}")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"no weights in {model_dir}: expected {SINGLE_FILE} or {INDEX_FILE}")


def iter_checkpoint(
    model_dir: str | Path, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of the checkpoint in ``model_dir``, file after file.

    Missing files are reported here, before any tensor is read."""
    return _iter_files(checkpoint_files(model_dir), str(device))


def _iter_files(files: list[Path], device: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for path in files:
        # the library's own words (``incomplete metadata, file not fully covered``) name no file
        try:
            with safe_open(str(path), framework="pt", device=device) as handle:
                for name in handle.keys():  # safe_open handles are not iterable
                    yield name, handle.get_tensor(name)
        except SafetensorError as exc:
            raise ModelPathError(f"{path} is truncated or corrupt: {exc}") from None


class SafetensorsFormat(WeightFormat):
    """A Hugging Face model directory: config.json, tokenizer files and safetensors weights."""

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and (path / "config.json").is_file()

    def hf_config(self) -> dict[str, Any]:
        return load_hf_config(self.path)

    def generation_config(self) -> dict[str, Any]:
        return load_generation_config(self.path)

    def tokenizer(self) -> Any:
        return load_tokenizer_dir(self.path)

    def num_weights(self) -> int | None:
        total = 0
        for path in checkpoint_files(self.path):
            try:
                total += len(read_header(path))
            except ValueError as exc:  # it names the file and what is wrong with it
                raise ModelPathError(f"{self.path}: {exc}") from None
        return total

    def weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in iter_checkpoint(self.path):
            # a no-op when the checkpoint already has the run dtype (the usual case on GPU)
            yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor


def open_model(path: str | Path, plugins: Plugins | None = None) -> WeightFormat:
    """The model at ``path``, read through the weight format that recognises it.

    Safetensors directories are the core's own; otherwise every registered format is asked in
    name order. Raises ``FileNotFoundError`` / ``ValueError`` with a one-line message saying what
    was expected when nothing fits."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    if SafetensorsFormat.detect(path):
        return SafetensorsFormat(path)
    if plugins is None:
        from minisgl_core.plugins import Plugins

        plugins = Plugins.load()
    for name in plugins.names("formats"):
        format_cls = plugins.resolve("formats", name)
        if format_cls.detect(path):
            return format_cls(path)
    formats = ", ".join(["safetensors (a directory with config.json)", *plugins.names("formats")])
    hint = "" if "gguf" in plugins.names("formats") else f" ({_gguf_hint(plugins)})"
    if path.is_dir():  # most often a Hugging Face directory missing its config.json
        raise FileNotFoundError(
            f"no model in {path}: no config.json, and no other format recognises it; supported formats: {formats}{hint}"
        )
    # a ValueError, as before; the command line's one-line kind
    raise ModelPathError(
        f"{path} is not a model this installation can read; supported formats: {formats}{hint}"
    )


def _gguf_hint(plugins: Plugins) -> str:
    """What .gguf files need: the gguf plugin, named as it is here when it is installed but not
    loaded (disabled, failed, in conflict: "need minisgl-plugin-gguf" read as not installed)."""
    info = next((i for i in plugins.infos if i.name == "gguf" and i.status != "ok"), None)
    if info is None:
        return ".gguf files need minisgl-plugin-gguf"
    state = {"conflict": "is in conflict", "failed": "failed to load"}.get(info.status, f"is {info.status}")
    return (
        f".gguf files need plugin 'gguf' ({info.distribution} {info.version}), which {state}: {info.reason}"
    )


class ModelPathError(ValueError):
    """``--model`` names nothing that can be loaded; the message says what and how to fix it
    (also :mod:`minisgl_core.checkpoint.path_check`'s, which checks a path before anything loads)."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer_dir(model_dir: str | Path) -> Any:
    """The HF tokenizer saved in ``model_dir`` (tokenizer.json / tokenizer_config.json); a
    ModelPathError naming the directory when there is none or it does not load."""
    from transformers import AutoTokenizer

    path = Path(model_dir)
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ModelPathError(
            f"no tokenizer in {path} (expected tokenizer.json, tokenizer.model or vocab.json next to config.json)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises bare Exceptions
        raise ModelPathError(tokenizer_message(path, exc)) from exc
    problem = model_max_length_problem(getattr(tokenizer, "model_max_length", None))
    if problem:
        raise ModelPathError(tokenizer_message(path, ValueError(f"tokenizer_config.json: {problem}")))
    return tokenizer


def model_max_length_problem(value: Any) -> str | None:
    """What is wrong with tokenizer_config.json's ``model_max_length``, which transformers loads
    as it is and compares with every text prompt's length: a string or a list was its TypeError
    ("'>' not supported between instances of 'int' and 'str'") from each encode, once the model
    had loaded."""
    if value is None or isinstance(value, (int, float)):
        return None
    return (
        f"model_max_length must be a number (the longest input, in tokens), got {json.dumps(value)[:80]}; "
        "fix it, or remove the key"
    )


def source_tokenizer(source: Any) -> Any:
    """``source.tokenizer()`` (a :class:`~minisgl_core.api.WeightFormat`'s), a ValueError it raises
    (a format's refusal of what its file holds: a GGUF file's damaged vocabulary) as a
    :class:`ModelPathError`, which the command line says in one line."""
    try:
        return source.tokenizer()
    except ModelPathError:
        raise
    except ValueError as exc:
        raise ModelPathError(str(exc)) from exc


def tokenizer_message(model_dir: Path, exc: BaseException) -> str:
    """What a tokenizer that does not load says, in the launcher's check and in the workers:
    config.json named where it is transformers' refusal of config.json (loading a tokenizer
    reads it; a ``tie_word_embeddings`` of "false" was blamed on the tokenizer files)."""
    refusal = config_refusal(exc)
    if refusal is not None:
        return f"{model_dir / 'config.json'}: {refusal}"
    return (
        f"tokenizer files in {model_dir} could not be loaded: {_first_lines(str(exc)) or type(exc).__name__}"
    )


def config_refusal(exc: BaseException) -> str | None:
    """transformers' own refusal of a config.json (its strict field and class validators, a rope
    setting missing a key), as one line; None for any other error."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # (an older huggingface_hub: transformers did not validate then)
        return None
    if isinstance(exc, StrictDataclassError):
        text = str(exc)
    elif isinstance(exc, KeyError) and exc.args and "rope_parameters" in str(exc.args[0]):
        text = str(exc.args[0])
    else:
        return None
    return f"transformers refuses it: {_first_lines(text)}"


def _first_lines(text: str, limit: int = 300) -> str:
    """The first two lines of an exception's text as one (the second holds the reason where the
    first ends in a colon: "Validation error for field 'rope_parameters':"), cut to ``limit``."""
    joined = " ".join(line.strip() for line in text.splitlines()[:2] if line.strip())
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."

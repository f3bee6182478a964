"""What a model directory's files promise each other, read without loading a tensor.

A weight file cut short (an interrupted copy or download) shows in the safetensors headers alone;
the tokenizer files parse in a fraction of a second. The launcher checks both before any process
starts (:func:`check_model_files`, from path_check), so a damaged model is one line naming the
file, not a scheduler rank's traceback once the weights load. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

from minisgl_core.checkpoint.formats import (
    TOKENIZER_FILES,
    ModelPathError,
    checkpoint_files,
    tokenizer_message,
)
from minisgl_core.checkpoint.safetensors_header import TensorEntry, read_header


def read_headers(model_dir: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint in ``model_dir``, from the headers of its files."""
    tensors: dict[str, TensorEntry] = {}
    for path in checkpoint_files(model_dir):
        tensors.update(read_header(path))
    return tensors


def check_tokenizer_files(model_dir: Path) -> None:
    """A ValueError unless ``model_dir`` has tokenizer files and the ones read as JSON parse
    (tokenizer.json through the tokenizers library, which is what loading it runs)."""
    if not any((model_dir / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(
            f"no tokenizer in {model_dir} (expected tokenizer.json, tokenizer.model or vocab.json next to "
            "config.json)"
        )
    try:
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            if (model_dir / name).is_file():
                try:
                    json.loads((model_dir / name).read_text(encoding="utf-8"))
                except ValueError as exc:
                    raise ValueError(f"{name} is not JSON ({exc})") from None
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            try:
                Tokenizer.from_file(str(model_dir / "tokenizer.json"))
            except Exception as exc:  # noqa: BLE001 - the library raises a bare Exception
                raise ValueError(f"tokenizer.json: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(tokenizer_message(model_dir, exc)) from None


def check_model_files(model: str | Path) -> None:
    """Raise ModelPathError (one line, naming the file) when a safetensors model directory's
    weights are cut short or corrupt, or its tokenizer does not load."""
    path = Path(model)
    try:
        read_headers(path)
        check_tokenizer_files(path)
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"--model {model}: {exc}") from None

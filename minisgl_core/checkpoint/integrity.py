"""What a model directory's files promise each other, read without loading a tensor.

A weight file cut short (an interrupted copy or download) shows in the safetensors headers alone.
The launcher checks them before any process starts (:func:`check_model_files`, from path_check),
so a damaged model is one line naming the file, not a scheduler rank's traceback once the weights
load. No torch here.
"""

from __future__ import annotations

from pathlib import Path

from minisgl_core.checkpoint.formats import ModelPathError, checkpoint_files
from minisgl_core.checkpoint.safetensors_header import TensorEntry, read_header


def read_headers(model_dir: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint in ``model_dir``, from the headers of its files."""
    tensors: dict[str, TensorEntry] = {}
    for path in checkpoint_files(model_dir):
        tensors.update(read_header(path))
    return tensors


def check_model_files(model: str | Path) -> None:
    """Raise ModelPathError (one line, naming the file) when a safetensors model directory's
    weights are cut short or corrupt."""
    try:
        read_headers(Path(model))
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"--model {model}: {exc}") from None

"""A first look at ``--model`` before anything slow starts: one clear line when it cannot be a model.

Checked in the launching process (serve, shell, generate, bench, ``LLM()``), so a typo costs a
second and a sentence, not a worker's traceback after the processes have started.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from minisgl_core.checkpoint.formats import INDEX_FILE, SINGLE_FILE, ModelPathError, SafetensorsFormat
from minisgl_core.checkpoint.integrity import check_model_files
from minisgl_core.setting_names import Spelling, given

WANTED = (
    "give a Hugging Face model directory (config.json, model.safetensors or a sharded index, "
    "tokenizer files) or a .gguf file"
)


#: the first bytes of a GGUF file, and of the text file Git LFS leaves in a clone without the data
GGUF_MAGIC = b"GGUF"
LFS_POINTER = b"version https://git-lfs"


def _unreadable(path: Path) -> bool:
    return not os.access(path, os.R_OK)


def check_model_path(model: str | Path, spelling: Spelling = "flag") -> None:
    """Raise ModelPathError (one line) unless ``model`` looks loadable: for a safetensors
    directory also its files' headers and its tokenizer; the loader checks the rest. The
    message names the setting as ``spelling`` says (``--model DIR`` or ``model='DIR'``)."""
    path = Path(model)
    given_as = given("model", model, spelling)
    if not path.exists():
        raise ModelPathError(f"{given_as}: no such file or directory; {WANTED}")
    if path.is_file():
        # A single weight file is a format plugin's business (GGUF, known by its first bytes
        # whatever its name: Ollama's blobs have none); anything else is a mistake.
        if _unreadable(path):
            raise ModelPathError(f"{given_as}: cannot read the file (permission denied)")
        with open(path, "rb") as handle:
            start = handle.read(len(LFS_POINTER))
        if start == LFS_POINTER:
            raise ModelPathError(
                f"{given_as} is a Git LFS pointer, not the model's data: fetch the file itself "
                "(`git lfs pull` in its repository)"
            )
        if start[:4] == GGUF_MAGIC:
            return
        if path.suffix.lower() == ".gguf":
            raise ModelPathError(f"{given_as} is not a GGUF file (it does not start with the GGUF magic)")
        raise ModelPathError(f"{given_as} is a file, not a model; {WANTED}")
    if not path.is_dir():  # /dev/null, a socket, a pipe: "cannot read the directory" was wrong
        raise ModelPathError(f"{given_as} is not a file or a directory; {WANTED}")
    if _unreadable(path) or not os.access(path, os.X_OK):
        raise ModelPathError(f"{given_as}: cannot read the directory (permission denied)")
    if not SafetensorsFormat.detect(path) and any(path.glob("*.gguf")):
        # open_model's choice: a directory with config.json loads as safetensors whatever else it
        # holds (a stray .gguf skipped every check of the weights it loads)
        return
    config = path / "config.json"
    if not config.is_file():
        raise ModelPathError(f"{given_as}: the directory has no config.json; {WANTED}")
    try:
        parsed = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"{given_as}: config.json is unreadable: {exc}") from None
    if not isinstance(parsed, dict) or not parsed.get("architectures"):
        raise ModelPathError(f"{given_as}: config.json names no architectures; {WANTED}")
    if not (path / SINGLE_FILE).is_file() and not (path / INDEX_FILE).is_file():
        gguf = next(iter(sorted(path.glob("*.gguf"))), None)
        hint = "" if gguf is None else f"; to load {gguf.name}, pass the file itself"
        raise ModelPathError(
            f"{given_as}: no weights in the directory (expected {SINGLE_FILE} or {INDEX_FILE}){hint}"
        )
    for weights in (path / SINGLE_FILE, path / INDEX_FILE):
        if weights.is_file() and _unreadable(weights):
            raise ModelPathError(f"{given_as}: cannot read {weights.name} (permission denied)")
    # the files themselves, from their headers: cut short, corrupt, or not what config.json says
    check_model_files(model, spelling)

"""Reading a Hugging Face model directory: config.json, generation_config.json and safetensors weights.

Weights stream as (checkpoint name, full tensor) pairs, one tensor at a time, so a model's
``load_weights`` can keep its rank's shard without the whole checkpoint in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from minisgl_core.model_dir import load_generation_config, load_hf_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

__all__ = ["checkpoint_files", "iter_checkpoint", "load_generation_config", "load_hf_config"]


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files holding the weights: the shards of the index, else ``model.safetensors``."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [model_dir / name for name in dict.fromkeys(weight_map.values())]
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
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt", device=device) as handle:
            for name in handle.keys():  # safe_open handles are not iterable
                yield name, handle.get_tensor(name)

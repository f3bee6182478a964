"""The JSON files of a Hugging Face model directory (config.json, generation_config.json).

Plain Python: the tokenizer process reads the sampling defaults from here without importing torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_hf_config(model_dir: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of ``model_dir``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: a model directory needs config.json and safetensors weights"
        )
    return json.loads(path.read_text())


def load_generation_config(model_dir: str | Path) -> dict[str, Any]:
    """The parsed ``generation_config.json``, or ``{}`` when the model has none."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON ({exc})") from None
    # (a list was an AttributeError from the first look-up of a field)
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def eos_token_ids(hf_config: dict, generation_config: dict) -> set[int]:
    """The ids that end generation: generation_config's eos_token_id(s), then config.json's."""
    ids: set[int] = set()
    for source in (generation_config, hf_config):
        value = source.get("eos_token_id")
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(int(v) for v in value)
    return ids

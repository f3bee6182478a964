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
    except OSError as exc:  # (a folder of that name, no permission: a traceback at start-up)
        raise ValueError(f"{path} is unreadable ({exc})") from None
    # (a list was an AttributeError from the first look-up of a field)
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def eos_token_ids(hf_config: dict, generation_config: dict, model_dir: str | Path | None = None) -> set[int]:
    """The ids that end generation: generation_config's eos_token_id(s), then config.json's.

    Raises ``ValueError`` naming the file (under ``model_dir`` when given) for a value that is not
    a token id (an integer >= 0) or a list of them: ``["x"]`` was a bare ``int()`` traceback at
    start-up, ``"2"`` and ``2.5`` were ignored or truncated (generation that never stopped where the
    model ends), and ``-5`` banned token ``vocab - 5`` from a request's ``min_tokens``."""
    ids: set[int] = set()
    for source, name in ((generation_config, "generation_config.json"), (hf_config, "config.json")):
        value = source.get("eos_token_id")
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            where = Path(model_dir) / name if model_dir is not None and Path(model_dir).is_dir() else name
            raise ValueError(
                f"{where}: eos_token_id must be a token id (an integer >= 0) or a list of them, got "
                f"{value!r}; fix it, or remove the key"
            )
        ids.update(values)
    return ids

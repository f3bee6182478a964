"""Opt-in pytest plugin for plugin authors: fixtures for tiny local models and a CUDA marker.

Enable it in a test module or your top-level ``conftest.py``::

    pytest_plugins = ["minisgl_core.testing.pytest_plugin"]

Fixtures (session-scoped, built on first use in pytest's temporary directory, no model hub):

- ``tiny_model_dir``: a random Qwen3 checkpoint (2 layers, hidden 64) with its tokenizer;
- ``tiny_llama_dir``: the same for Llama;
- ``make_tiny_model``: ``make_tiny_model(arch="Qwen3ForCausalLM", **config_overrides) -> Path``,
  cached per arguments;
- ``tiny_tokenizer_dir`` / ``tiny_tokenizer``: the byte-level BPE tokenizer alone (ChatML template);
- ``minisgl_plugins``: the core's view of the installed plugins (``minisgl_core.plugins.Plugins``).

Marker: ``@pytest.mark.minisgl_cuda`` skips a test when no CUDA GPU is visible.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "minisgl_cuda: needs a CUDA GPU; skipped without one")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("minisgl_cuda") is not None:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")


@pytest.fixture(scope="session")
def make_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from minisgl_core.demo.factories import make_model_dir

    built: dict[str, Path] = {}

    def make(arch: str = "Qwen3ForCausalLM", **config_overrides: Any) -> Path:
        key = json.dumps([arch, config_overrides], sort_keys=True, default=str)
        if key not in built:
            built[key] = make_model_dir(
                tmp_path_factory.mktemp("minisgl-model") / arch, arch, **config_overrides
            )
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(make_tiny_model: Callable[..., Path]) -> Path:
    return make_tiny_model("Qwen3ForCausalLM")


@pytest.fixture(scope="session")
def tiny_llama_dir(make_tiny_model: Callable[..., Path]) -> Path:
    return make_tiny_model("LlamaForCausalLM")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from minisgl_core.demo.factories import train_tokenizer

    return train_tokenizer(tmp_path_factory.mktemp("minisgl-tokenizer"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.fixture(scope="session")
def minisgl_plugins() -> Any:
    from minisgl_core.plugins import Plugins

    return Plugins.load()

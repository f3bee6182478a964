"""Session fixtures shared by the core's tests: the real default model and its reference outputs."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct through the product's own path: fetched once into the cache, reused."""
    from minisgl_core.checkpoint.resolve import resolve_model

    return Path(resolve_model(None))


@pytest.fixture(scope="session")
def real_references(default_model_dir: Path):
    """transformers' greedy outputs for the real-model prompts, computed once per session."""
    from minisgl_core.testing.real_model import transformers_references

    return transformers_references(default_model_dir)

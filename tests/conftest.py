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


@pytest.fixture(scope="session")
def default_model_greedy_run(default_model_dir: Path):
    """The engine's own greedy run of the real-model prompts (unquantized, radix cache, page size
    1, logprobs): the quantization tests' reference, and one of the runs compared with
    transformers (tests/test_real_weights.py), computed once per session."""
    from minisgl_core.testing.quant_accuracy import greedy_run

    return greedy_run(default_model_dir)


@pytest.fixture
def install_plugin_module(tmp_path, monkeypatch):
    """``install(module, distribution, source)``: a one-module plugin ``module`` (its entry point
    named like it), as a distribution on sys.path for this test only."""

    def install(module: str, distribution: str, source: str) -> None:
        (tmp_path / f"{module}.py").write_text(source)
        info = tmp_path / f"{module}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n")
        (info / "entry_points.txt").write_text(
            f"[minisgl.plugins]\n{module.removeprefix('minisgl_')} = {module}\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))

    return install

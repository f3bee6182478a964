"""Session fixtures shared by the core's tests: the real default model and its reference outputs."""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct through the product's own path: fetched once into the cache, reused."""
    from minisgl_core.checkpoint.resolve import resolve_model

    return Path(resolve_model(None))


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], T]) -> T:
    """``compute()`` once per test run: under pytest-xdist the first worker to ask computes it and
    leaves it (pickled) in the run's temporary root, which every worker shares; the others wait for
    it and read it (each worker has its own session, so a session fixture alone would compute it
    once per worker)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return compute()
    root = tmp_path_factory.getbasetemp().parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = root / f"{name}.pickle"
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def real_references(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """transformers' greedy outputs for the real-model prompts, computed once per run."""
    from minisgl_core.testing.real_model import transformers_references

    return once_per_run(
        tmp_path_factory, "real_references", lambda: transformers_references(default_model_dir)
    )


@pytest.fixture(scope="session")
def default_model_greedy_run(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The engine's own greedy run of the real-model prompts (unquantized, radix cache, page size
    1, logprobs): the quantization tests' reference, and one of the runs compared with
    transformers (tests/test_real_weights.py), computed once per run."""
    from minisgl_core.testing.quant_accuracy import greedy_run

    return once_per_run(tmp_path_factory, "default_model_greedy_run", lambda: greedy_run(default_model_dir))


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


@pytest.fixture
def torch_backend_lacking(install_plugin_module):
    """``install(name, capability)``: an attention plugin registering, as ``name``, the torch
    backend less ``capability`` (what a backend not declaring it does to a model needing it)."""

    def install(name: str, capability: str) -> None:
        source = (
            "from minisgl_core.api import hookimpl\n"
            "from minisgl_plugin_torch.backend import TorchAttentionBackend\n\n"
            'MINISGL_API = "2.0"\n\n\n'
            "class Lacking(TorchAttentionBackend):\n"
            f"    capabilities = TorchAttentionBackend.capabilities - {{{capability!r}}}\n\n\n"
            "@hookimpl\n"
            "def minisgl_register_attention_backends(register):\n"
            f"    register({name!r}, 'minisgl_{name}:Lacking')\n"
        )
        install_plugin_module(f"minisgl_{name}", f"minisgl-{name}", source)

    return install

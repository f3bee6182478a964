"""The fa3 plugin without a GPU: registration, cheap import, and which prefill path availability()
and prefill_path() report for each combination of GPU and installed kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import minisgl_plugin_fa3
import pytest
import torch
from minisgl_plugin_fa3 import backend as fa3_backend
from minisgl_plugin_fa3.backend import FlashAttention3Backend
from minisgl_plugin_fi.backend import FlashInferBackend

from minisgl_core.testing.attention_suite import import_target

PLUGIN_DIR = Path(__file__).resolve().parents[1]


def test_registers_fa3_backend() -> None:
    calls: list[tuple[str, str]] = []
    minisgl_plugin_fa3.minisgl_register_attention_backends(
        register=lambda name, target: calls.append((name, target))
    )
    assert calls == [("fa3", "minisgl_plugin_fa3.backend:FlashAttention3Backend")]
    cls = import_target(calls[0][1])
    # Decode and CUDA graphs are the fi backend's, so they are declared too.
    assert cls is FlashAttention3Backend and issubclass(cls, FlashInferBackend)
    assert {"prefill", "decode", "page_size>1", "cuda_graph"} <= cls.capabilities
    assert cls.prefill_kernels == "fa3"


def test_a_float8_pool_is_refused_and_auto_prefills_it_with_fi() -> None:
    """fa3 has no kernel for bf16 queries over float8 K/V (FlashInfer's SM90 prefill failed to
    build in the GPU suite while fa3 inherited fi's "kv_fp8"): it declares everything fi does but
    that, ``--attn fa3`` with a float8 pool stops at start naming the fix, and ``auto`` on Hopper
    prefills such a pool with fi."""
    from minisgl_core.plugins import PluginError
    from minisgl_core.runner.model_runner import check_kv_dtype, pick_attention

    assert FlashAttention3Backend.capabilities == FlashInferBackend.capabilities - {"kv_fp8"}
    backends = {"fa3": FlashAttention3Backend, "fi": FlashInferBackend}
    with pytest.raises(PluginError, match="'fa3' does not support --kv-cache-dtype fp8_e4m3.*--attn fi"):
        check_kv_dtype("fp8_e4m3", torch.float8_e4m3fn, torch.bfloat16, backends)
    check_kv_dtype("fp8_e4m3", torch.float8_e4m3fn, torch.bfloat16, {"fi": FlashInferBackend})

    class Plugins:  # fa3 and fi usable, as on an H100
        registry = {"attention": {name: type(name, (cls,), {"availability": classmethod(lambda c, d: None)})
                                  for name, cls in backends.items()}}  # fmt: skip

        def resolve(self, kind, name):
            return self.registry[kind][name]

    gpu = torch.device("cuda", 0)
    assert pick_attention("auto", gpu, Plugins(), frozenset({"kv_fp8"}))[0] == "fi"
    assert pick_attention("auto", gpu, Plugins())[0] == "fa3"


def test_distribution_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())["project"]
    assert project["name"] == "minisgl-plugin-fa3"
    assert project["entry-points"]["minisgl.plugins"] == {"fa3": "minisgl_plugin_fa3"}
    deps = project["dependencies"]
    assert any(d.startswith("flashinfer-python") for d in deps) and any(
        d.startswith("minisgl-plugin-fi") for d in deps
    )
    assert [d.split(">")[0] for d in project["optional-dependencies"]["flash-attn"]] == ["flash-attn"]
    assert minisgl_plugin_fa3.MINISGL_API == "2.7"


def test_import_loads_no_kernels() -> None:
    """Discovery, availability() and prefill_path() import no kernels; a non-CUDA device starts no CUDA."""
    code = (
        "import sys, torch, minisgl_plugin_fa3, minisgl_plugin_fa3.backend as b\n"
        "kernels = lambda: any(m in sys.modules for m in ('flashinfer', 'flash_attn_interface'))\n"
        "b.FlashAttention3Backend.availability(torch.device('cpu')); b.FlashAttention3Backend.prefill_path()\n"
        "print(kernels(), torch.cuda.is_initialized())\n"
        "b.FlashAttention3Backend.availability(torch.device('cuda'))\n"
        "print(kernels())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_unavailable_without_cuda() -> None:
    reason = FlashAttention3Backend.availability(torch.device("cpu"))
    assert reason is not None and "CUDA" in reason
    if not torch.cuda.is_available():
        assert "is_available" in FlashAttention3Backend.availability(torch.device("cuda"))


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    def install(capability: tuple[int, int], modules: set[str]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(fa3_backend, "module_installed", lambda name: name in modules)

    return install


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_needs_hopper(fake_gpu, capability: tuple[int, int]) -> None:
    fake_gpu(capability, {"flashinfer", "flash_attn_interface"})
    reason = FlashAttention3Backend.availability(torch.device("cuda"))
    assert reason is not None and "sm9x" in reason and f"sm{capability[0]}{capability[1]}" in reason


def test_flashinfer_fallback(fake_gpu) -> None:
    fake_gpu((9, 0), {"flashinfer"})
    assert FlashAttention3Backend.availability(torch.device("cuda")) is None
    assert FlashAttention3Backend.prefill_path() == "flashinfer"


def test_prefers_flash_attn_interface(fake_gpu) -> None:
    fake_gpu((9, 0), {"flashinfer", "flash_attn_interface"})
    assert FlashAttention3Backend.availability(torch.device("cuda")) is None
    assert FlashAttention3Backend.prefill_path() == "flash_attn_interface"


def test_flash_attn_alone_is_not_enough(fake_gpu) -> None:
    """Decode runs on FlashInfer, so the reason says FA3 was found and what is still missing."""
    fake_gpu((9, 0), {"flash_attn_interface"})
    reason = FlashAttention3Backend.availability(torch.device("cuda"))
    assert reason is not None and "FlashAttention-3 is installed" in reason and "flashinfer-python" in reason


def test_nothing_installed(fake_gpu) -> None:
    fake_gpu((9, 0), set())
    reason = FlashAttention3Backend.availability(torch.device("cuda"))
    assert reason is not None and "pip install flashinfer-python" in reason
    assert "FlashAttention-3 is installed" not in reason

"""The fi backend's own logic on the CPU: the attention conformance suite over FlashInfer's
wrappers as :mod:`flashinfer_double` models them (float32). What it checks is the backend's
planning: the step's layout handed to each wrapper, a pass per sliding window the layers use and
each layer reading its own, cascade's two passes and their merge, and a windowed model running no
cascade. FlashInfer's kernels themselves are checked by the same suite on a GPU (``test_fi_suite.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from minisgl_plugin_fi.backend import FlashInferBackend, window_passes

from minisgl_core.api import AttentionConfig, KVCache
from minisgl_core.testing.attention_suite import AttentionBackendSuite

sys.path.insert(0, str(Path(__file__).parent))
import flashinfer_double  # noqa: E402


class FlashInferOnCpu(flashinfer_double.OnCpu, FlashInferBackend):
    pass


@pytest.fixture(autouse=True)
def _double(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer_double)


class TestFlashInferPlanningOnCpu(AttentionBackendSuite):
    backend_cls = FlashInferOnCpu
    gqa_ratios = (1, 4)
    head_dims = (64,)
    # (the double loops over sequences in Python; the float32 tolerances hold)


def config(num_layers: int, window: int, layers: set[int]) -> AttentionConfig:
    cache = KVCache(
        num_layers=num_layers, num_pages=4, page_size=1, num_kv_heads=1, head_dim=8, dtype=torch.float32,
        device="cpu",
    )  # fmt: skip
    return AttentionConfig(
        num_qo_heads=1, num_kv_heads=1, head_dim=8, scale=1.0, page_size=1, dtype=torch.float32,
        device=torch.device("cpu"), max_requests=2, max_context_len=4, kv_cache=cache,
        sliding_window=window, window_layers=frozenset(layers),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("window", "layers", "passes", "pass_of"),
    [
        (0, set(), (-1,), [0, 0, 0]),  # no window: one causal pass
        (5, {0, 1, 2}, (4,), [0, 0, 0]),  # Mistral: every layer slides, one windowed pass
        (5, {0, 2}, (-1, 4), [1, 0, 1]),  # Gemma 2: the even layers slide, two passes
        (0, {0, 2}, (-1,), [0, 0, 0]),  # layers named but no window: causal
    ],
)
def test_window_passes(window: int, layers: set[int], passes: tuple[int, ...], pass_of: list[int]) -> None:
    """``window_left`` is the keys a query sees before its own: the window less one."""
    got_passes, got_pass_of = window_passes(config(3, window, layers))
    assert got_passes == passes
    assert [got_pass_of[layer] for layer in range(3)] == pass_of

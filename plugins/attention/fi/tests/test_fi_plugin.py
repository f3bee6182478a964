"""The fi plugin without a GPU: registration, cheap import, and availability() reasons."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import minisgl_plugin_fi
import pytest
import torch
from minisgl_plugin_fi import availability
from minisgl_plugin_fi.backend import FlashInferBackend
from minisgl_plugin_fi.cascade import cascade_layout

from minisgl_core.api import AttentionBackend, SharedPrefix
from minisgl_core.testing.attention_suite import import_target
from minisgl_core.testing.paged import pages_needed, random_paged_batch

PLUGIN_DIR = Path(__file__).resolve().parents[1]


def registered() -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    minisgl_plugin_fi.minisgl_register_attention_backends(
        register=lambda name, target: calls.append((name, target))
    )
    return calls


def test_registers_fi_backend() -> None:
    assert registered() == [("fi", "minisgl_plugin_fi.backend:FlashInferBackend")]
    cls = import_target(registered()[0][1])
    assert cls is FlashInferBackend and issubclass(cls, AttentionBackend)
    assert {"prefill", "decode", "page_size>1", "cuda_graph"} <= cls.capabilities


def test_distribution_metadata() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())["project"]
    assert project["name"] == "minisgl-plugin-fi"
    assert project["entry-points"]["minisgl.plugins"] == {"fi": "minisgl_plugin_fi"}
    assert any(dep.startswith("flashinfer-python") for dep in project["dependencies"])
    assert minisgl_plugin_fi.MINISGL_API == "2.7"


def test_import_loads_no_kernels() -> None:
    """Discovery and availability() import no FlashInfer; neither starts CUDA on a non-CUDA device."""
    code = (
        "import sys, torch, minisgl_plugin_fi, minisgl_plugin_fi.backend as b\n"
        "b.FlashInferBackend.availability(torch.device('cpu'))\n"
        "print('flashinfer' in sys.modules, torch.cuda.is_initialized())\n"
        "b.FlashInferBackend.availability(torch.device('cuda'))\n"
        "print('flashinfer' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_unavailable_without_cuda() -> None:
    reason = FlashInferBackend.availability(torch.device("cpu"))
    assert reason is not None and "CUDA" in reason
    if not torch.cuda.is_available():
        reason = FlashInferBackend.availability(torch.device("cuda"))
        assert reason is not None and "is_available" in reason


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """Pretend a GPU of a given compute capability and a given set of installed modules."""

    def install(capability: tuple[int, int], modules: set[str]) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(availability, "module_installed", lambda name: name in modules)
        monkeypatch.setattr(
            sys.modules[FlashInferBackend.__module__], "module_installed", lambda name: name in modules
        )

    return install


def test_available_on_ampere_with_flashinfer(fake_gpu) -> None:
    fake_gpu((8, 0), {"flashinfer"})
    assert FlashInferBackend.availability(torch.device("cuda")) is None


def test_reason_names_missing_flashinfer(fake_gpu) -> None:
    fake_gpu((9, 0), set())
    reason = FlashInferBackend.availability(torch.device("cuda"))
    assert reason is not None and "pip install flashinfer-python" in reason


def test_reason_names_old_gpu(fake_gpu) -> None:
    fake_gpu((7, 5), {"flashinfer"})
    reason = FlashInferBackend.availability(torch.device("cuda"))
    assert reason is not None and "sm75" in reason and "sm80+" in reason


def test_module_installed_does_not_import() -> None:
    assert availability.module_installed("json")
    assert not availability.module_installed("surely_not_a_module_minisgl")
    assert not availability.module_installed("surely_not_a_package_minisgl.sub")


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_cascade_layout(page_size: int, pad: bool) -> None:
    """The prefix pass has one entry per group (its rows, the prefix's pages of its first
    sequence) or lone sequence (all its pages); the suffix pass one per sequence."""
    seq_lens = [9, 13, 21, 5, 17, 30]
    batch = random_paged_batch(
        seq_lens,
        [1] * len(seq_lens),
        page_size=page_size,
        num_pages=pages_needed(seq_lens, page_size) + 2,
        max_requests=8,
        max_context_len=32,
        attn=None,  # type: ignore[arg-type]  # only the layout is used
        generator=torch.Generator().manual_seed(page_size),
    )
    batch.shared_prefixes = [SharedPrefix(1, 3, 8), SharedPrefix(4, 6, 4)]
    layout = cascade_layout(batch, page_size, pad_entries=pad)
    rows = batch.req_slots.long().tolist()

    def pages(seq: int, start: int, end: int) -> list[int]:
        return [int(batch.page_table[rows[seq], p]) // page_size for p in range(start, end, page_size)]

    entries = [(0, 0, 9), (1, 0, 8), (3, 0, 5), (4, 0, 4)]
    assert layout.qo_indptr == [0, 1, 3, 4, 6] + ([6, 6] if pad else [])
    expected = [p for seq, start, end in entries for p in pages(seq, start, end)]
    assert layout.prefix.kv_indices.tolist() == expected
    assert len(layout.prefix.kv_indptr) == len(layout.qo_indptr)
    last_page = [
        (0, 8 // page_size * page_size),
        (1, 8),
        (2, 8),
        (3, 4 // page_size * page_size),
        (4, 4),
        (5, 4),
    ]
    suffix = [p for seq, start in last_page for p in pages(seq, start, seq_lens[seq])]
    assert layout.suffix.kv_indices.tolist() == suffix
    assert layout.in_group == [0, 1, 1, 0, 1, 1]


def test_cascade_layout_rejects_bad_groups() -> None:
    batch = random_paged_batch(
        [9, 13, 21], [1, 1, 1], page_size=1, num_pages=50, max_requests=4, max_context_len=32,
        attn=None, generator=torch.Generator().manual_seed(0),  # type: ignore[arg-type]
    )  # fmt: skip
    for groups, message in [
        ([SharedPrefix(0, 2, 9)], "bad shared prefix"),  # no suffix left for the 9-token one
        ([SharedPrefix(1, 4, 4)], "outside the batch"),
        ([SharedPrefix(0, 2, 4), SharedPrefix(1, 3, 4)], "overlap"),
    ]:
        batch.shared_prefixes = groups
        with pytest.raises(ValueError, match=message):
            cascade_layout(batch, 1, pad_entries=False)


@pytest.mark.parametrize(
    ("value", "on"),
    [
        (None, True),
        ("", True),
        ("1", True),
        ("yes", True),
        ("0", False),
        ("false", False),
        (" Off ", False),
        ("no", False),
    ],
)
def test_the_tensor_core_switch_takes_the_core_s_spellings(value, on):
    """MINISGL_FI_TENSOR_CORES=false left the tensor-core decode on: only "0" counted."""
    from minisgl_plugin_fi.backend import tensor_cores_from_env

    assert tensor_cores_from_env(value) is on

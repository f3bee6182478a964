"""The weight-format conformance suite on GGUF files written from tiny random models."""

from __future__ import annotations

from pathlib import Path

from minisgl_plugin_gguf.format import GGUFFormat
from minisgl_plugin_gguf.writer import write_gguf

from minisgl_core.testing.format_suite import CHAT_TEMPLATE, TOKENIZER, TRUNCATION, WeightFormatSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite

ALL = frozenset({TOKENIZER, CHAT_TEMPLATE, TRUNCATION})


class TestGGUFFloat32(WeightFormatSuite):
    """Lossless: the Q/K permutation and every name must round-trip exactly."""

    format_cls = GGUFFormat
    capabilities = ALL

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        return write_gguf(hf_dir, out_dir / "model.gguf", "F32")


class TestGGUFQ8InADirectory(WeightFormatSuite):
    """Q8_0 (one scale per 32 weights: error at most half a step of 1/127), given as a directory."""

    format_cls = GGUFFormat
    capabilities = ALL
    weight_tolerance = 0.5 / 127 + 1e-6

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        write_gguf(hf_dir, out_dir / "model-q8_0.gguf", "Q8_0")
        return out_dir


class TestGGUFPackaging(PluginPackagingSuite):
    plugin = "gguf"
    provides = {"formats": ["gguf"]}

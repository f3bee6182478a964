"""The weight-format conformance suite on GGUF files written from tiny random models."""

from __future__ import annotations

from pathlib import Path

from minisgl_plugin_gguf.format import GGUFFormat
from minisgl_plugin_gguf.writer import write_gguf

from minisgl_core.testing.format_suite import CHAT_TEMPLATE, TOKENIZER, TRUNCATION, WeightFormatSuite
from minisgl_core.testing.packaging_suite import PluginPackagingSuite

ALL = frozenset({TOKENIZER, CHAT_TEMPLATE, TRUNCATION})
#: transformers builds a qwen3 GGUF's tokenizer with Qwen2's pre-tokenizer (digits one by one),
#: right for real Qwen3 files but not for the tiny test tokenizer (GPT-2 splitting), so the id
#: comparison runs on the llama file; the qwen3 file's chat template is still checked
TOKENIZER_ARCHS = ("LlamaForCausalLM",)


class TestGGUFFloat32(WeightFormatSuite):
    """Lossless: the Q/K permutation and every name must round-trip exactly."""

    format_cls = GGUFFormat
    capabilities = ALL
    tokenizer_architectures = TOKENIZER_ARCHS

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        return write_gguf(hf_dir, out_dir / "model.gguf", "F32")


class TestGGUFQ8InADirectory(WeightFormatSuite):
    """Q8_0 (one float16 scale per 32 weights: error at most half a step of 1/127, plus the
    scale's own float16 rounding, 2**-11 of up to 127 steps), given as a directory."""

    format_cls = GGUFFormat
    capabilities = ALL
    tokenizer_architectures = TOKENIZER_ARCHS
    weight_tolerance = (0.5 + 127 * 2**-11) / 127

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        write_gguf(hf_dir, out_dir / "model-q8_0.gguf", "Q8_0")
        return out_dir


class TestGGUFPackaging(PluginPackagingSuite):
    plugin = "gguf"
    provides = {"formats": ["gguf"]}

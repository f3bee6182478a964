"""Conformance suite that every :class:`~minisgl_core.api.WeightFormat` runs: a round trip.

Subclass :class:`WeightFormatSuite`, set ``format_cls`` and implement ``write``, which stores a
tiny random Hugging Face model (safetensors, byte-level BPE tokenizer, ChatML template) in your
format::

    class TestMyFormat(WeightFormatSuite):
        format_cls = MyFormat                 # or "module:Class", or the registered name ("mine")
        weight_tolerance = 0.01               # lossy formats: max error / largest |weight|
        capabilities = frozenset({"tokenizer", "chat_template", "truncation"})

        def write(self, hf_dir, out_dir):
            return convert(hf_dir, out_dir / "model.mine")

The suite reads the result back through your class and checks it against the original: what
``detect`` accepts, the config our model plugins read, every weight's name, shape, dtype and
values (within ``weight_tolerance``), that the core's :func:`~minisgl_core.checkpoint.formats.open_model`
picks your format, and, per declared capability, the tokenizer's ids, the chat template's
rendering and a clear error for a truncated file. Tests for undeclared capabilities are skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
import torch

from minisgl_core.api import WeightFormat
from minisgl_core.testing.targets import resolve

TOKENIZER = "tokenizer"
CHAT_TEMPLATE = "chat_template"
#: the format detects a truncated file when it is opened (before any model is built)
TRUNCATION = "truncation"

#: config keys the model plugins read, compared exactly (floats approximately)
_CONFIG_KEYS = (
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)
_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about the sea, please!"},
]


class WeightFormatSuite:
    #: the weight format: its class, "package.module:Class", or a name an installed plugin registers
    format_cls: ClassVar[type[WeightFormat] | str]
    #: the tiny models written and read back, by Hugging Face architecture
    architectures: ClassVar[tuple[str, ...]] = ("LlamaForCausalLM", "Qwen3ForCausalLM")
    #: largest allowed |read - written| of a weight, relative to that weight's largest |value|
    weight_tolerance: ClassVar[float] = 0.0
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: architectures whose tokenizer must round-trip (None: all); a format whose tokenizer depends
    #: on the architecture (GGUF: transformers gives qwen3 files Qwen2's digit-splitting
    #: pre-tokenizer) may exclude those the tiny test tokenizer does not fit
    tokenizer_architectures: ClassVar[tuple[str, ...] | None] = None

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        """Store the model in ``hf_dir`` in your format under ``out_dir``; the path to pass to ``--model``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ fixtures

    @pytest.fixture(scope="class")
    @classmethod
    def round_trip(cls, tmp_path_factory: pytest.TempPathFactory):
        """{architecture: (original HF directory, path written in the format)}."""
        from minisgl_core.demo.factories import make_model_dir

        written = {}
        for arch in cls.architectures:
            root = tmp_path_factory.mktemp(f"format-{arch}")
            # tied embeddings for one of them, so formats that drop the LM head are covered
            hf_dir = make_model_dir(root / "hf", arch, tie_word_embeddings=arch.startswith("Qwen3"))
            out_dir = root / "written"
            out_dir.mkdir()
            written[arch] = (hf_dir, cls().write(hf_dir, out_dir))
        return written

    @classmethod
    def format_class(cls) -> type[WeightFormat]:
        if getattr(cls, "format_cls", None) is None:
            raise TypeError(f"{cls.__name__} must set format_cls")
        return resolve("formats", cls.format_cls)

    def _require(self, capability: str) -> None:
        if capability not in self.capabilities:
            pytest.skip(f"{self.format_class().__name__} does not declare {capability!r}")

    # ------------------------------------------------------------------ tests

    def test_detects_what_it_wrote_and_nothing_else(self, round_trip, tmp_path: Path) -> None:
        for _, path in round_trip.values():
            assert self.format_class().detect(Path(path)), f"detect({path}) is false for a file it wrote"
        assert not self.format_class().detect(tmp_path), "detect() accepts an empty directory"
        assert not self.format_class().detect(tmp_path / "missing"), (
            "detect() accepts a path that does not exist"
        )
        stray = tmp_path / "notes.txt"
        stray.write_text("not a model")
        assert not self.format_class().detect(stray), "detect() accepts a text file"

    def test_open_model_picks_this_format(self, round_trip) -> None:
        from minisgl_core.checkpoint.formats import open_model

        for _, path in round_trip.values():
            assert isinstance(open_model(path), self.format_class())

    def test_config_round_trips(self, round_trip) -> None:
        from minisgl_core.checkpoint.formats import load_hf_config
        from minisgl_core.layers.rotary import rope_parameters

        for arch, (hf_dir, path) in round_trip.items():
            expected, actual = load_hf_config(hf_dir), self.format_class()(Path(path)).hf_config()
            for key in _CONFIG_KEYS:
                assert actual.get(key) == expected.get(key), f"{arch}: config[{key!r}]"
            # read as the model plugins read them (transformers 5 nests rope_theta in rope_parameters)
            assert actual.get("rms_norm_eps", 1e-6) == pytest.approx(
                expected.get("rms_norm_eps", 1e-6), rel=1e-6
            )
            theta = rope_parameters(actual)["rope_theta"]
            assert theta == pytest.approx(rope_parameters(expected)["rope_theta"], rel=1e-6), (
                f"{arch}: rope_theta"
            )
            head_dim = actual.get("head_dim") or actual["hidden_size"] // actual["num_attention_heads"]
            assert head_dim == expected["head_dim"], f"{arch}: head_dim"

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_weights_round_trip(self, round_trip, dtype: torch.dtype) -> None:
        from minisgl_core.checkpoint.formats import iter_checkpoint, load_hf_config

        for arch, (hf_dir, path) in round_trip.items():
            expected = dict(iter_checkpoint(hf_dir))
            if load_hf_config(hf_dir).get("tie_word_embeddings"):
                expected.pop("lm_head.weight", None)  # a format may store a tied head once
            source = self.format_class()(Path(path))
            actual = dict(source.weights(dtype))
            if "lm_head.weight" not in expected:
                actual.pop("lm_head.weight", None)
            assert set(actual) == set(expected), f"{arch}: names differ: {set(actual) ^ set(expected)}"
            if source.num_weights() is not None:
                assert source.num_weights() == len(actual), f"{arch}: num_weights() != tensors yielded"
            cast_error = 0.0 if dtype == torch.float32 else 2**-7
            for name, tensor in actual.items():
                want = expected[name].float()
                assert tensor.dtype == dtype, f"{arch}: {name} is {tensor.dtype}, asked for {dtype}"
                assert tuple(tensor.shape) == tuple(want.shape), f"{arch}: {name} shape"
                scale = float(want.abs().max()) or 1.0
                error = float((tensor.float() - want).abs().max()) / scale
                allowed = self.weight_tolerance + cast_error
                assert error <= allowed, (
                    f"{arch}: {name} differs by {error:.3g} x its scale (allowed {allowed:.3g})"
                )

    def test_tokenizer_round_trips(self, round_trip) -> None:
        self._require(TOKENIZER)
        from minisgl_core.demo.corpus import builtin_corpus
        from minisgl_core.tokenizer.load import load_tokenizer_dir

        texts = builtin_corpus(num_sentences=50, seed=3) + [
            "<|im_start|>user\nhi<|im_end|>",
            "  two  spaces\n\ttab",
        ]
        for arch, (hf_dir, path) in round_trip.items():
            if self.tokenizer_architectures is not None and arch not in self.tokenizer_architectures:
                continue
            expected, actual = load_tokenizer_dir(hf_dir), self.format_class()(Path(path)).tokenizer()
            for text in texts:
                ids = actual.encode(text, add_special_tokens=False)
                assert ids == expected.encode(text, add_special_tokens=False), f"{arch}: ids of {text!r}"
                assert actual.decode(ids) == expected.decode(ids), f"{arch}: decoding {text!r}"
            assert actual.eos_token == expected.eos_token, f"{arch}: eos token"

    def test_chat_template_round_trips(self, round_trip) -> None:
        self._require(CHAT_TEMPLATE)
        from minisgl_core.tokenizer.load import apply_chat_template, load_tokenizer_dir

        for arch, (hf_dir, path) in round_trip.items():
            expected = apply_chat_template(load_tokenizer_dir(hf_dir), _MESSAGES)
            assert apply_chat_template(self.format_class()(Path(path)).tokenizer(), _MESSAGES) == expected, (
                arch
            )

    def test_truncated_file_fails_when_opened(self, round_trip, tmp_path: Path) -> None:
        self._require(TRUNCATION)
        for arch, (_, path) in round_trip.items():
            path = Path(path)
            file = path if path.is_file() else max(path.iterdir(), key=lambda p: p.stat().st_size)
            damaged_dir = tmp_path / arch
            damaged_dir.mkdir()
            if path.is_dir():
                import shutil

                shutil.copytree(path, damaged_dir, dirs_exist_ok=True)
                damaged = damaged_dir / file.name
            else:
                damaged = damaged_dir / file.name
            data = file.read_bytes()  # keep the header, cut into the weights
            damaged.write_bytes(data[: len(data) * 2 // 3])
            target = damaged_dir if path.is_dir() else damaged
            with pytest.raises(ValueError, match="truncated"):
                self.format_class()(target)

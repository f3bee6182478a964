"""Conformance suite for model plugins: subclass it, name the class and the architecture, run pytest.

    from minisgl_core.testing.model_suite import ModelSuite

    class TestMyModel(ModelSuite):
        model_cls = MyForCausalLM               # or "module:Class", or the registered architecture
        architecture = "MyForCausalLM"          # the config.json "architectures" entry
        config_overrides = {"num_hidden_layers": 2}

The suite builds one tiny random checkpoint per class (:meth:`make_model_dir`; the default knows
the Hugging Face configs :func:`minisgl_core.testing.make_model_dir` does, override it for
others), then checks: the KV spec matches the config, every checkpoint tensor is consumed and
every parameter loaded, names the model does not know are not claimed, the logits have the
contract's shape, and, when ``transformers`` implements the architecture, prefill and decode
logits and greedy tokens match it. Capabilities: ``"transformers_reference"`` and
``"tensor_parallel"`` (each TP rank loads its shard of the same checkpoint); undeclared ones
are skipped. Runs on the ``torch`` attention backend (install minisgl-plugin-torch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from minisgl_core.api import Model, ParallelContext
from minisgl_core.checkpoint.formats import iter_checkpoint, load_hf_config
from minisgl_core.testing.harness import PagedSequences, make_attention
from minisgl_core.testing.reference import (
    check_batch_against_transformers,
    check_greedy_against_transformers,
    checkpoint_names,
    load_model,
)
from minisgl_core.testing.targets import resolve

KNOWN_CAPABILITIES = frozenset({"transformers_reference", "tensor_parallel"})


class ModelSuite:
    #: the model: its class, "package.module:Class", or an architecture an installed plugin registers
    model_cls: ClassVar[type[Model] | str | None] = None
    #: the ``architectures`` entry of the config.json it implements
    architecture: ClassVar[str] = ""
    #: changes to the tiny default config (2 layers, hidden 64, 4 heads, 2 KV heads, head_dim 16)
    config_overrides: ClassVar[dict[str, Any]] = {}
    capabilities: ClassVar[frozenset[str]] = KNOWN_CAPABILITIES
    #: the attention backend the model runs on (a registered --attn name or a class)
    attention_backend: ClassVar[type | str] = "torch"
    #: logits tolerance relative to the logit scale (float32 on CPU)
    rel: ClassVar[float] = 1e-4
    seed: ClassVar[int] = 0

    # --- hooks a subclass may override ---

    def make_model_dir(self, path: Path) -> Path:
        """Write a random checkpoint of the architecture (config.json, safetensors, tokenizer).

        The default writes the architectures the demo factory knows (transformers' own configs
        and initialisation); a plugin adding another overrides this to write its own checkpoint,
        e.g. the factory's of a related architecture with config.json's ``architectures`` and
        the weight names changed."""
        from minisgl_core.demo.factories import make_model_dir

        try:
            return make_model_dir(path, self.architecture, seed=self.seed, **self.config_overrides)
        except ValueError as exc:
            if not str(exc).startswith("unknown arch"):
                raise
            raise TypeError(
                f"{type(self).__name__}: the suite's default make_model_dir writes only the "
                f"architectures it knows ({exc}); override make_model_dir(self, path) to write a "
                f"checkpoint of {self.architecture!r} into path and return it"
            ) from None

    # --- plumbing ---

    @classmethod
    def model_class(cls) -> type[Model]:
        if cls.model_cls is None or not cls.architecture:
            raise TypeError(f"{cls.__name__} must set model_cls and architecture")
        return resolve("models", cls.model_cls)

    def backend_class(self) -> type:
        from minisgl_core.plugins import PluginError

        try:
            return resolve("attention", self.attention_backend)
        except PluginError as exc:
            pytest.skip(f"attention backend {self.attention_backend!r} unavailable: {exc}")

    def require(self, capability: str) -> None:
        if capability not in self.capabilities:
            pytest.skip(f"model does not declare {capability!r}")

    @pytest.fixture(scope="class")
    @classmethod
    def model_dir(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        """One checkpoint per suite class: building it is the slow part."""
        return cls().make_model_dir(tmp_path_factory.mktemp(cls.architecture or "model") / "model")

    # --- the tests ---

    def test_capabilities_are_known(self) -> None:
        assert issubclass(self.model_class(), Model)
        unknown = set(self.capabilities) - KNOWN_CAPABILITIES
        assert not unknown, f"unknown capabilities {sorted(unknown)}; known: {sorted(KNOWN_CAPABILITIES)}"

    def test_kv_spec_matches_the_config(self, model_dir: Path) -> None:
        hf = load_hf_config(model_dir)
        model, _ = load_model(self.model_class(), model_dir)
        spec = model.kv_spec
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        expected = (hf["num_hidden_layers"], heads, hf.get("num_key_value_heads") or heads, head_dim)
        assert (spec.num_layers, spec.num_qo_heads, spec.num_kv_heads, spec.head_dim) == expected
        assert spec.scale > 0

    def test_every_checkpoint_tensor_is_consumed(self, model_dir: Path) -> None:
        _, used = load_model(self.model_class(), model_dir)
        unused = checkpoint_names(model_dir) - used
        assert not unused, f"checkpoint tensors the model did not use: {sorted(unused)[:8]}"

    def test_every_parameter_is_loaded(self, model_dir: Path) -> None:
        """Parameters start as NaN; after loading none may be left (an unloaded one stays NaN)."""
        from minisgl_core.api import ModelConfig

        config = ModelConfig(
            hf_config=load_hf_config(model_dir),
            dtype=torch.float32,
            device=torch.device("cpu"),
            parallel=ParallelContext(),
        )
        model = self.model_class()(config)
        for param in model.parameters():
            param.data.fill_(float("nan"))
        model.load_weights(iter_checkpoint(model_dir))
        unloaded = [name for name, p in model.named_parameters() if torch.isnan(p).any()]
        assert not unloaded, f"parameters never (fully) loaded from the checkpoint: {unloaded[:8]}"

    def test_unknown_tensors_are_not_claimed(self, model_dir: Path) -> None:
        """The core reports tensors a model leaves unused, so a model must not claim names it ignores."""
        model, _ = load_model(self.model_class(), model_dir)
        stray = [
            ("model.layers.0.not_a_real_module.weight", torch.zeros(3)),
            ("totally_unknown", torch.zeros(1)),
        ]
        used = model.load_weights(iter([*iter_checkpoint(model_dir), *stray]))
        assert not used & {name for name, _ in stray}, f"load_weights claimed tensors it cannot use: {used}"

    def test_logits_shape_and_dtype(self, model_dir: Path) -> None:
        model, _ = load_model(self.model_class(), model_dir)
        vocab_size = load_hf_config(model_dir)["vocab_size"]
        sequences = PagedSequences(make_attention(self.backend_class(), model.kv_spec, page_size=4))
        rows = [sequences.new_row() for _ in range(3)]
        with torch.inference_mode():
            logits = model(sequences.extend(rows, [[5, 6, 7], [8], [9, 10, 11, 12, 13]]))
        # float32 or the model's dtype (API 1.2); this suite loads models in float32
        assert logits.shape == (3, vocab_size) and logits.dtype == torch.float32
        assert torch.isfinite(logits).all()

    def transformers_knows(self) -> None:
        self.require("transformers_reference")
        import transformers

        if not hasattr(transformers, self.architecture):
            pytest.skip(f"transformers has no {self.architecture}: no reference to compare with")

    def test_greedy_decode_matches_transformers(self, model_dir: Path) -> None:
        self.transformers_knows()
        tokens = check_greedy_against_transformers(
            self.model_class(), model_dir, self.backend_class(), prompt_len=12, steps=4, rel=self.rel
        )
        assert len(tokens) == 5

    def test_batched_steps_match_transformers(self, model_dir: Path) -> None:
        self.transformers_knows()
        check_batch_against_transformers(
            self.model_class(),
            model_dir,
            self.backend_class(),
            prompt_lens=(4, 9),
            decode_steps=1,
            page_size=2,
            rel=self.rel,
        )

    def test_tensor_parallel_ranks_load_their_shards(self, model_dir: Path) -> None:
        """Each rank of tp_size 2 consumes the whole checkpoint into half-sized attention shards."""
        self.require("tensor_parallel")
        full, _ = load_model(self.model_class(), model_dir)
        names = checkpoint_names(model_dir)
        for rank in range(2):
            shard, used = load_model(
                self.model_class(), model_dir, parallel=ParallelContext(tp_rank=rank, tp_size=2)
            )
            assert used == names, f"rank {rank} left checkpoint tensors unused: {sorted(names - used)[:8]}"
            assert shard.kv_spec.num_qo_heads * 2 == full.kv_spec.num_qo_heads
            assert sum(p.numel() for p in shard.parameters()) < sum(p.numel() for p in full.parameters())

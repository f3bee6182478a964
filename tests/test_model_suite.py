"""The model conformance suite must fail models with typical bugs: each mutant of Qwen3 below has
one, and the suite test named next to it has to fail on it; the real Qwen3 passes them all."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from minisgl_plugin_qwen3.model import Qwen3ForCausalLM

from minisgl_core.layers import rope_parameters
from minisgl_core.testing import make_model_dir
from minisgl_core.testing.model_suite import ModelSuite


class AlwaysTied(Qwen3ForCausalLM):
    """Ties the output projection to the embeddings whatever the config says: lm_head.weight is unused."""

    def __init__(self, config):
        super().__init__(config)
        self.lm_head.weight = self.model.embed_tokens.weight

    def load_weights(self, weights):
        return super().load_weights((n, t) for n, t in weights if n != "lm_head.weight")


class ClaimsEverything(Qwen3ForCausalLM):
    def load_weights(self, weights):
        weights = list(weights)
        super().load_weights(weights)
        return {name for name, _ in weights}


class IgnoresRopeTheta(Qwen3ForCausalLM):
    def __init__(self, config):
        params = {**rope_parameters(config.hf_config), "rope_theta": 10.0}
        hf = {**config.hf_config, "rope_parameters": params, "rope_theta": 10.0}
        super().__init__(dataclasses.replace(config, hf_config=hf))


MUTANTS = [
    (AlwaysTied, "test_every_checkpoint_tensor_is_consumed", "lm_head.weight"),
    (IgnoresRopeTheta, "test_greedy_decode_matches_transformers", "logits of step"),
    (ClaimsEverything, "test_unknown_tensors_are_not_claimed", "claimed"),
    (IgnoresRopeTheta, "test_batched_steps_match_transformers", "sequence"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("suite") / "qwen3", "Qwen3ForCausalLM", rope_theta=10000.0)


def suite_for(model_cls: type) -> ModelSuite:
    class Suite(ModelSuite):
        architecture = "Qwen3ForCausalLM"

    Suite.model_cls = model_cls
    return Suite()


@pytest.mark.parametrize(
    ("model_cls", "test_name", "message"), MUTANTS, ids=[f"{m[0].__name__}-{m[1][5:]}" for m in MUTANTS]
)
def test_suite_catches(model_dir: Path, model_cls: type, test_name: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        getattr(suite_for(model_cls), test_name)(model_dir)


def test_the_real_model_passes_the_same_tests(model_dir: Path) -> None:
    suite = suite_for(Qwen3ForCausalLM)
    for _, test_name, _ in MUTANTS:
        getattr(suite, test_name)(model_dir)


def test_a_new_architecture_is_told_to_write_its_own_checkpoint(tmp_path: Path) -> None:
    """A third party's architecture name got the factory's bare "unknown arch" from every test,
    and only the suite's source said make_model_dir may be overridden (found by a plugin
    walkthrough)."""

    class NewArch(ModelSuite):
        model_cls = "LlamaForCausalLM"
        architecture = "NewArchForCausalLM"

    with pytest.raises(TypeError, match=r"^NewArch: the suite's default make_model_dir writes only") as err:
        NewArch().make_model_dir(tmp_path)
    assert "override make_model_dir(self, path) to write a checkpoint of 'NewArchForCausalLM'" in str(
        err.value
    )

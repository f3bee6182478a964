"""``LLM.update_weights_from_disk``: the served model takes a new checkpoint of its config in place
and then answers exactly as an engine started on that checkpoint (quantized at load too, and from
a GGUF file); one that does not fit is refused with the old weights still serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.llm import LLM
from minisgl_core.sampling import SamplingParams

PROMPTS = ["The quick brown fox", "one two three four five six seven eight"]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def tokens(llm: LLM) -> list[list[int]]:
    return [list(out.token_ids) for out in llm.generate(PROMPTS, PARAMS)]


def answers(model: Path, **options) -> list[list[int]]:
    with LLM(model, device="cpu", attn="torch", **options) as llm:
        return tokens(llm)


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("steps")
    return {
        "a": make_model_dir(root / "a", "LlamaForCausalLM", seed=1),
        "b": make_model_dir(root / "b", "LlamaForCausalLM", seed=2),
    }


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_new_weights_answer_as_a_fresh_engine_on_them(steps, quantization):
    reference_b = answers(steps["b"], quantization=quantization)
    with LLM(steps["a"], device="cpu", attn="torch", quantization=quantization) as llm:
        before = tokens(llm)
        assert before != reference_b
        freed = llm.update_weights_from_disk(steps["b"])
        assert freed > 0  # the prompts' cached pages, computed by the old weights
        assert tokens(llm) == reference_b
        assert llm.update_weights_from_disk(steps["a"]) > 0
        assert tokens(llm) == before


def test_a_checkpoint_of_another_config_is_refused(steps, tmp_path):
    other = make_model_dir(tmp_path / "wider", "LlamaForCausalLM", seed=2, intermediate_size=96)
    with LLM(steps["a"], device="cpu", attn="torch") as llm:
        before = tokens(llm)
        with pytest.raises(ValueError, match=r"intermediate_size 96 \(served: \d+\)"):
            llm.update_weights_from_disk(other)
        with pytest.raises(FileNotFoundError, match="does not exist"):
            llm.update_weights_from_disk(tmp_path / "nowhere")
        assert tokens(llm) == before


def test_a_tensor_of_another_shape_is_refused(steps, tmp_path):
    """The config alone matches: the weights themselves do not fit it."""
    import shutil

    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(steps["b"], broken)
    for file in broken.glob("*.safetensors"):
        weights = load_file(file)
        for name in list(weights):
            if name.endswith("o_proj.weight"):
                weights[name] = weights[name][:, :-8].contiguous()
        save_file(weights, file, metadata={"format": "pt"})
    with LLM(steps["a"], device="cpu", attn="torch") as llm:
        before = tokens(llm)
        with pytest.raises(ValueError, match="o_proj"):
            llm.update_weights_from_disk(broken)
        assert tokens(llm) == before

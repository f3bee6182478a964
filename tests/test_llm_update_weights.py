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


def test_a_model_path_of_another_type_is_a_type_error_naming_it(steps):
    """``update_weights_from_disk(5)`` was os.fspath's bare TypeError ("expected str, bytes or
    os.PathLike object, not int"), "" read as the working directory ("no model in ."), and
    ``flush_cache="no"`` taken as true; the HTTP route's body refuses all three with a 400."""
    with LLM(steps["a"], device="cpu", attn="torch") as llm:
        before = tokens(llm)
        for bad in (5, None, b"/tmp", ["/tmp"]):
            with pytest.raises(TypeError, match=r"^model_path must be a path \(str or os.PathLike\)"):
                llm.update_weights_from_disk(bad)
        with pytest.raises(ValueError, match="^model_path is empty"):
            llm.update_weights_from_disk(" ")
        with pytest.raises(TypeError, match="^flush_cache must be True or False, got 'no'"):
            llm.update_weights_from_disk(steps["b"], flush_cache="no")
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


def test_no_memory_for_a_second_copy_is_refused_with_the_old_weights_serving(steps, monkeypatch):
    """The new weights load beside the served ones: where the memory for that copy is not free,
    the update is refused in words (a CPU process out of memory would be killed, the server with
    it), and the old weights serve on."""
    from minisgl_core.runner import model_runner

    with LLM(steps["a"], device="cpu", attn="torch") as llm:
        before = tokens(llm)
        monkeypatch.setattr(model_runner, "free_bytes", lambda device: 1 << 20)
        with pytest.raises(
            ValueError, match=r"second copy of the weights needs 0\.2\d GiB on cpu .* 0\.00 GiB is free"
        ):
            llm.update_weights_from_disk(steps["b"])
        assert tokens(llm) == before
        monkeypatch.undo()
        llm.update_weights_from_disk(steps["b"])
        assert tokens(llm) == answers(steps["b"])


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_a_gpu_without_room_stages_plain_weights_in_host_memory(steps, monkeypatch, quantization):
    """Where the second copy goes on a GPU whose memory the KV pool took (the default): host
    memory for plain floating-point weights, which the served tensors then copy; quantized ones
    (a method's load-time work may depend on the device) are refused, naming the settings that
    leave the GPU room. The loading and copying from host memory run in the GPU suite
    (``tests/test_gpu_features.py``)."""
    import torch

    from minisgl_core.runner import model_runner

    with LLM(steps["a"], device="cpu", attn="torch", quantization=quantization) as llm:
        runner = llm.engine.runner
        gpu_free = {"free": 1 << 40}
        host_free = {"free": 1 << 40}
        monkeypatch.setattr(runner, "device", torch.device("cuda", 0))
        monkeypatch.setattr(model_runner, "_free_for_tensors", lambda device: gpu_free["free"])
        monkeypatch.setattr(model_runner, "free_bytes", lambda device: host_free["free"])
        assert runner._staging_device("new") == torch.device("cuda", 0)  # room on the GPU
        gpu_free["free"] = 1 << 20
        if quantization is None:
            assert runner._host_stageable()
            assert runner._staging_device("new") == torch.device("cpu")
            host_free["free"] = 1 << 20
            with pytest.raises(ValueError, match=r"neither cuda:0 nor host memory \(0\.00 GiB free\)"):
                runner._staging_device("new")
        else:
            assert not runner._host_stageable()  # (int8's integer weights)
            with pytest.raises(
                ValueError,
                match=r"quantization='int8'\) load on the GPU only: .*kv_memory_fraction= or num_kv_tokens=",
            ):
                runner._staging_device("new")


def test_a_gpu_that_runs_out_while_staging_stages_in_host_memory(steps, monkeypatch):
    """The GPU's free memory is read before the new weights load; where something takes it
    meanwhile and the load runs out, a plain model's copy loads again in host memory."""
    import torch

    from minisgl_core.runner import model_runner

    load = model_runner.ModelRunner._load_model
    tried: list[str] = []

    def load_on(self, plugins, before_weights=None, device=None):
        tried.append(str(device))
        if device is not None and device.type == "cuda":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return load(self, plugins, before_weights, device)

    with LLM(steps["a"], device="cpu", attn="torch") as llm:
        before = tokens(llm)
        monkeypatch.setattr(llm.engine.runner, "device", torch.device("cuda", 0))
        monkeypatch.setattr(model_runner, "_free_for_tensors", lambda device: 1 << 40)
        monkeypatch.setattr(model_runner.ModelRunner, "_load_model", load_on)
        llm.update_weights_from_disk(steps["b"])
        assert tried == ["cuda:0", "cpu"]
        monkeypatch.undo()
        assert tokens(llm) == answers(steps["b"]) != before

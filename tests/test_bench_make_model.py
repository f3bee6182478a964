"""`minisgl bench make-model` checks where it would draw the weights before it writes anything."""

from __future__ import annotations

import copy

import pytest
import torch

from minisgl_core.bench.shapes import build_random_model
from minisgl_core.testing.cli_runner import run_cli


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("nope", "--device must be cpu, cuda or cuda:N; got 'nope'"),
        ("meta", "--device must be cpu, cuda or cuda:N; got 'meta'"),
        *([] if torch.cuda.is_available() else
          [("cuda", "--device cuda was asked for but CUDA is not available here; use --device cpu")]),
    ],
)  # fmt: skip
def test_a_device_it_cannot_use_is_one_line_and_nothing_is_written(tmp_path, device, says):
    """It was torch's traceback, after the missing folders and the tokenizer files were written."""
    out = tmp_path / "deep" / "model"
    proc = run_cli(["bench", "make-model", "--shape", "qwen3-0.6b", "--out", str(out), "--device", device])
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [f"minisgl: error: {says}"]
    assert list(tmp_path.iterdir()) == []


def test_build_random_model_on_a_bad_device_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        build_random_model("qwen3-0.6b", tmp_path / "deep" / "model", device="nope")
    assert list(tmp_path.iterdir()) == []


def _built(folder, shape: str) -> None:
    """What a build of ``shape`` leaves that a second build looks at (no weights)."""
    import json

    from minisgl_core.bench.shapes import SHAPES

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(dict(SHAPES[shape], torch_dtype="bfloat16")))
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {}}')


def test_a_folder_holding_anything_but_this_shape_built_before_is_refused(tmp_path):
    """A real model's folder had its config.json and tokenizer overwritten beside its own weights,
    and a folder with another shape's index was taken as built (found by a probe)."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "config.json").write_text('{"REAL": 1}')
    (real / "model.safetensors").write_bytes(b"W")
    other = tmp_path / "other"
    _built(other, "qwen3-0.6b")
    for folder in (real, other):
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        proc = run_cli(["bench", "make-model", "--shape", "llama-3.1-8b", "--out", str(folder)])
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        assert proc.stderr.strip() == (
            f"minisgl bench make-model: error: --out {folder} is not empty and holds no llama-3.1-8b built "
            "before: give a new or empty folder"
        ), proc.stderr
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    same = tmp_path / "same"  # built before: kept, nothing written
    _built(same, "llama-3.1-8b")
    assert build_random_model("llama-3.1-8b", same) == same and len(list(same.iterdir())) == 2


def test_a_folder_holding_this_shape_built_before_is_kept_and_says_so(tmp_path):
    """It printed the path and exited 0 as if it had built the model: nothing said that it wrote
    nothing (a user asking for a fresh model with another seed or dtype in mind could not tell).
    Still exit status 0 and the path on stdout, which benchmark scripts rely on."""
    same = tmp_path / "same"
    _built(same, "llama-3.1-8b")
    before = {p.name: p.read_bytes() for p in same.iterdir()}
    proc = run_cli(["bench", "make-model", "--shape", "llama-3.1-8b", "--out", str(same)])
    assert proc.returncode == 0 and proc.stdout == f"{same}\n", (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == (
        f"minisgl bench make-model: {same} already holds a model of this shape (llama-3.1-8b); kept it, "
        "nothing written; give a new --out to build another"
    ), proc.stderr
    assert {p.name: p.read_bytes() for p in same.iterdir()} == before


def test_an_out_that_is_a_file_is_one_line_naming_the_fix(tmp_path):
    """``--out /dev/null`` (or any file) was "--out [Errno 17] File exists: '/dev/null'", mkdir's
    words, after the generator was made; the file is left as it was."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("kept")
    for out in (str(a_file), "/dev/null"):
        with pytest.raises(FileExistsError) as err:
            build_random_model("qwen3-0.6b", out, device="cpu")
        assert str(err.value) == f"{out} is a file, not a folder: give a new or empty folder"
    assert a_file.read_text() == "kept"


def test_an_empty_out_is_refused_not_the_working_directory(tmp_path):
    """``--out ''`` wrote the 1.2 GB model into the working directory and printed "."."""
    proc = run_cli(["bench", "make-model", "--shape", "qwen3-0.6b", "--out", ""], cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == (
        "minisgl bench make-model: error: --out is empty: give the folder to write the model to\n"
    ), proc.stderr  # (a usage error, as argparse's: it exited 1, as a failed run does)
    assert list(tmp_path.iterdir()) == []


def test_a_build_cut_short_leaves_nothing_the_next_run_would_refuse(tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) during the build left the tokenizer files in --out, and the next run
    was refused: "--out ... is not empty: give a new or empty folder". What it wrote goes; the
    folders it made go too, the parents it made for --out included (new/model left new behind),
    and an empty one given stays."""
    import minisgl_core.bench.shapes as shapes

    def interrupted(config):
        raise KeyboardInterrupt

    monkeypatch.setattr(shapes, "parameter_shapes", interrupted)  # (after the tokenizer is written)
    given = tmp_path / "given"
    given.mkdir()
    for out in (tmp_path / "new" / "model", given):
        with pytest.raises(KeyboardInterrupt):
            build_random_model("qwen3-0.6b", out)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["given"]


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b", "qwen2.5-7b"])
def test_linear_shapes_are_the_checkpoints_products_fused(shape):
    """The tools' GEMM shapes (``linear_shapes``) are the checkpoint's q/k/v and gate/up weights
    stacked as the engine fuses them, o_proj, down_proj, and the LM head (the embedding when tied)."""
    from minisgl_core.bench.shapes import SHAPES, linear_shapes, parameter_shapes

    config = SHAPES[shape]
    weights = parameter_shapes(config)
    layer = {
        name.split(".", 3)[3]: dims for name, dims in weights.items() if name.startswith("model.layers.0.")
    }
    q, k, v = (layer[f"self_attn.{p}_proj.weight"] for p in "qkv")
    gate, up = layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    assert linear_shapes(config) == {
        "qkv": (q[0] + k[0] + v[0], q[1]),
        "o": layer["self_attn.o_proj.weight"],
        "gate_up": (gate[0] + up[0], gate[1]),
        "down": layer["mlp.down_proj.weight"],
        "lm_head": head,
    }
    assert config.get("tie_word_embeddings", False) == ("lm_head.weight" not in weights)


def test_linear_shapes_of_a_mixture_of_experts_are_one_experts_and_the_router():
    from minisgl_core.bench.shapes import SHAPES, linear_shapes, parameter_shapes

    config = SHAPES["qwen3-30b-a3b"]
    weights = parameter_shapes(config)
    p = "model.layers.0.mlp."
    gate, up = weights[p + "experts.0.gate_proj.weight"], weights[p + "experts.127.up_proj.weight"]
    products = linear_shapes(config)
    assert products["gate_up"] == (gate[0] + up[0], gate[1])
    assert products["down"] == weights[p + "experts.5.down_proj.weight"]
    assert products["router"] == weights[p + "gate.weight"] == (128, 2048)
    assert p + "gate_proj.weight" not in weights  # no dense MLP in a sparse layer


@pytest.mark.parametrize(
    "shape", ["qwen3-0.6b", "llama-3.1-8b", "qwen2.5-7b", "qwen3-30b-a3b", "mixtral-8x7b"]
)
def test_parameter_shapes_are_what_transformers_builds(shape):
    """make-model writes ``parameter_shapes``: the names and shapes transformers' own model of the
    config has (Qwen2's q/k/v biases and Qwen3's q/k norms included), the LM head left out when tied."""
    import transformers

    from minisgl_core.bench.shapes import SHAPES, parameter_shapes

    config = SHAPES[shape]
    # (a deep copy: transformers writes rope_theta into llama-3.1's rope_scaling, and a later
    # test of this process then wrote that changed shape: "holds no llama-3.1-8b built before")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**copy.deepcopy(config))
        )
    expected = {
        name: tuple(t.shape)
        for name, t in model.state_dict().items()
        if not (config["tie_word_embeddings"] and name == "lm_head.weight")
    }
    # transformers 5 holds a layer's experts as two 3-D tensors; a released checkpoint (what
    # make-model writes) has each expert's gate/up/down, which is what it saves too
    for name in [n for n in expected if n.endswith(".mlp.experts.gate_up_proj")]:
        experts, rows, hidden = expected.pop(name)
        prefix = name.removesuffix("gate_up_proj")
        inter = expected.pop(prefix + "down_proj")[2]
        assert rows == 2 * inter
        for e in range(experts):
            expected |= {f"{prefix}{e}.gate_proj.weight": (inter, hidden), f"{prefix}{e}.up_proj.weight": (inter, hidden),
                         f"{prefix}{e}.down_proj.weight": (hidden, inter)}  # fmt: skip
    if config["model_type"] == "mixtral":  # its checkpoints' names (what transformers saves too)
        renames = {
            ".mlp.": ".block_sparse_moe.",
            ".gate_proj.": ".w1.",
            ".up_proj.": ".w3.",
            ".down_proj.": ".w2.",
        }
        for name in [n for n in expected if ".mlp." in n]:
            new = name
            for old, replacement in renames.items():
                new = new.replace(old, replacement)
            expected[new] = expected.pop(name)
    assert parameter_shapes(config) == expected

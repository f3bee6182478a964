"""A config.json value no model can be built from (architectures not a list, a size that is not a
positive integer...) is one error naming config.json and the field, from the launcher's check, from
the runner (Engine() alone, or a weight format the launcher does not read) and on the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from minisgl_core import LLM
from minisgl_core.api import ParallelContext
from minisgl_core.checkpoint.integrity import check_shapes, read_headers
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.config import EngineConfig
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import Plugins
from minisgl_core.testing.cli_runner import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM")


def _with_config(model_dir: Path, tmp_path: Path, **changes: object) -> Path:
    out = tmp_path / "edited"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text()) | changes
    (out / "config.json").write_text(json.dumps(config))
    return out


def _refused_by_launcher_and_runner(bad: Path, says: str) -> None:
    """``bad`` refused with ``says`` by ``LLM()``'s first look and by the engine alone, as the
    runner of a process the launcher did not check refuses it."""
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: {says}"
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert str(err.value) == f"--model {bad}: {says}"


ARCHITECTURES_SAYS = 'config.json: architectures must be a list of names, e.g. ["LlamaForCausalLM"], got '


@pytest.mark.parametrize("value", ["Qwen3ForCausalLM", {"name": "Qwen3ForCausalLM"}, ["Qwen3ForCausalLM", 3]])
def test_architectures_not_a_list_of_names_is_refused_naming_the_field(model_dir, tmp_path, value):
    """A string was indexed: "unknown model architecture 'Q'". transformers declares list[str] and
    its own code reads architectures[0] too, so a string is refused, not taken as one name."""
    bad = _with_config(model_dir, tmp_path, architectures=value)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: {ARCHITECTURES_SAYS}{json.dumps(value)}"


def test_the_runner_refuses_architectures_not_a_list_when_the_launcher_did_not_check(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path, architectures="Qwen3ForCausalLM")
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert str(err.value) == f'--model {bad}: {ARCHITECTURES_SAYS}"Qwen3ForCausalLM"'


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(args)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"architectures": "Qwen3ForCausalLM"}, f'{ARCHITECTURES_SAYS}"Qwen3ForCausalLM"'),
        ({"hidden_size": "abc"}, 'config.json: hidden_size must be a positive integer, got "abc"'),
        (
            {"max_position_embeddings": -5},
            "config.json: max_position_embeddings must be a positive integer, got -5",
        ),
    ],
    ids=["architectures-a-string", "hidden_size-abc", "max_position_embeddings-below-one"],
)
def test_a_bad_config_value_is_one_line_on_the_command_line(model_dir, tmp_path, changes, says):
    bad = _with_config(model_dir, tmp_path, **changes)
    proc = _cli("serve", "--port", "0", "--model", str(bad), "--device", "cpu")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [f"minisgl: error: --model {bad}: {says}"]


SIZES = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "vocab_size",
)  # fmt: skip
NOT_POSITIVE_INTEGERS = ("abc", 0, -5, True, 64.0, [64])


@pytest.mark.parametrize("value", NOT_POSITIVE_INTEGERS, ids=json.dumps)
@pytest.mark.parametrize("field", SIZES)
def test_a_size_not_a_positive_integer_is_refused_naming_the_field(model_dir, tmp_path, field, value):
    """Each was a TypeError or RuntimeError from torch while the model was built, an IndexError, a
    shape mismatch blamed on the weights, or (head_dim 0) a model that loaded."""
    bad = _with_config(model_dir, tmp_path, **{field: value})
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert (
        str(err.value)
        == f"model={str(bad)!r}: config.json: {field} must be a positive integer, got {json.dumps(value)}"
    )


THETA_SAYS = "must be a number above 1 (the rotary base; models use 10000 to 1e9), got "
EPS_SAYS = "must be a number between 0 and 1 (the norm's epsilon; models use 1e-5 or 1e-6), got "
INF = float("inf")
NOT_A_ROTARY_BASE = ("abc", 0, -1.0, True, float("nan"), INF, 1e-320, 0.5, 1, 1e39, [10000.0], None)
NOT_A_NORM_EPSILON = ("abc", 0, -1.0, True, float("nan"), INF, 1e308, 1, 7.0, [1e-6])


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        *(("rope_theta", value, THETA_SAYS) for value in NOT_A_ROTARY_BASE),
        *(("rope_parameters.rope_theta", value, THETA_SAYS) for value in NOT_A_ROTARY_BASE),
        *(("rms_norm_eps", value, EPS_SAYS) for value in NOT_A_NORM_EPSILON),
    ],
    ids=lambda value: json.dumps(value)[:16],
)
def test_a_rope_theta_or_norm_epsilon_that_cannot_be_right_is_refused(
    model_dir, tmp_path, field, value, says
):
    """rope_theta -1 or "abc" and rms_norm_eps -1 loaded a model that answered nonsense; so did a
    rotary base of 1e-320 (an infinity), 0.5 or 1 (frequencies that do not fall), 1e39 (infinite in
    float32), and an epsilon of 1e308 or 7 (every activation flattened). A rope_theta of null (no
    rope setting giving one) was a TypeError traceback from the rotary's build."""
    nest, _, key = field.rpartition(".")
    changes = {nest: {"rope_type": "default", key: value}} if nest else {key: value, "rope_parameters": None}
    bad = _with_config(model_dir, tmp_path, **changes)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: config.json: {field} {says}{json.dumps(value)}"


@pytest.mark.parametrize(
    ("field", "value"),
    [("rope_parameters.full_attention.rope_theta", 0.5), ("rope_local_base_freq", 1e-320)],
    ids=["full-attention", "local-base"],
)
def test_gemma3s_rotary_bases_are_checked_too(tmp_path, field, value):
    """Gemma 3 gives a rope_theta a layer type (and the older rope_local_base_freq): 0.5 loaded."""
    model = make_model_dir(tmp_path / "gemma3", "Gemma3ForCausalLM")
    config = json.loads((model / "config.json").read_text())
    if field == "rope_local_base_freq":
        changes = {"rope_parameters": None, field: value}
    else:
        changes = {"rope_parameters": {**config["rope_parameters"], "full_attention": {"rope_theta": value}}}
    bad = _with_config(model, tmp_path, **changes)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: config.json: {field} {THETA_SAYS}{json.dumps(value)}"


SCALE_SAYS = "must be a positive number float32 holds (1.2e-38 to 3.4e38), got "
FACTOR_SAYS = "must be a number of at least 1 (the positions are divided by it), got "


@pytest.mark.parametrize("value", ["x", 0.0, -2.0, 0.5, 1e308, 1e-320, None], ids=json.dumps)
@pytest.mark.parametrize("nest", ["rope_scaling", "rope_parameters"])
def test_a_rope_scaling_factor_that_cannot_be_right_is_refused(model_dir, tmp_path, nest, value):
    """A linear scaling's factor 0 or 1e-320 divided the rotary frequencies into infinities (a
    model that answered nonsense), 1e308 made them 0 in float32 and 0.5 sped every rotation up
    (transformers' rule: at least 1); "x" and null were TypeError tracebacks from a worker."""
    bad = _with_config(
        model_dir, tmp_path, **{nest: {"rope_type": "linear", "rope_theta": 1e4, "factor": value}}
    )
    if nest == "rope_scaling":
        config = json.loads((bad / "config.json").read_text())
        config.pop("rope_parameters", None)  # (read first when present)
        (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert (
        str(err.value) == f"model={str(bad)!r}: config.json: {nest}.factor {FACTOR_SAYS}{json.dumps(value)}"
    )


LLAMA3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 1024}  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("factor", 1e-320, FACTOR_SAYS),
        ("factor", None, FACTOR_SAYS),
        ("low_freq_factor", 1e308, SCALE_SAYS),
        ("low_freq_factor", 1e-320, SCALE_SAYS),
        ("high_freq_factor", float("inf"), SCALE_SAYS),
        ("high_freq_factor", 0.0, SCALE_SAYS),
        ("original_max_position_embeddings", 0.5, "must be a positive integer, got "),
        ("original_max_position_embeddings", 1024.0, "must be a positive integer, got "),
    ],
    ids=lambda value: json.dumps(value)[:16],
)
def test_a_llama3_rope_scaling_number_that_cannot_be_right_is_refused(model_dir, tmp_path, key, value, says):
    """Llama 3.1's scaling: each loaded a model that answered nonsense (1e-320: token 0 only), and
    a factor of null was a TypeError traceback from the rotary's build."""
    bad = _with_config(model_dir, tmp_path, rope_parameters={**LLAMA3, key: value})
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert (
        str(err.value) == f"model={str(bad)!r}: config.json: rope_parameters.{key} {says}{json.dumps(value)}"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden_size", "abc"), ("num_hidden_layers", 0), ("rms_norm_eps", -1), ("rope_theta", 0.5)],
)
def test_the_runner_refuses_a_bad_size_when_the_launcher_did_not_check(model_dir, tmp_path, field, value):
    bad = _with_config(model_dir, tmp_path, **{field: value})
    with pytest.raises(ModelPathError) as err:
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    assert f"--model {bad}: config.json: {field} must be a " in str(err.value)


@pytest.mark.parametrize("shape", ["qwen3-0.6b", "llama-3.1-8b"])
def test_real_configs_and_left_out_or_null_values_pass(shape):
    from minisgl_core.bench.shapes import SHAPES
    from minisgl_core.checkpoint.integrity import check_config_values

    check_config_values(dict(SHAPES[shape]))  # (llama 3.1: a rope_scaling without rope_theta)
    check_config_values({**SHAPES[shape], "head_dim": None, "num_key_value_heads": None})
    # (a null rope_theta beside the rope settings' own is no missing one)
    nested = {"rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    check_config_values({**SHAPES[shape], "rope_theta": None, **nested})
    check_config_values({key: value for key, value in SHAPES[shape].items() if key != "rms_norm_eps"})


def test_another_architecture_keeps_its_own_meaning_of_the_llama_names():
    """A plugin's model may give these names other meanings (per-layer lists): only the sizes the
    engine itself reads are checked for it."""
    from minisgl_core.checkpoint.integrity import check_config_values

    check_config_values(
        {"architectures": ["OpenELMForCausalLM"], "num_attention_heads": [4, 8], "vocab_size": 32}
    )
    with pytest.raises(ValueError, match="config.json: vocab_size must be a positive integer, got 0"):
        check_config_values({"architectures": ["OpenELMForCausalLM"], "vocab_size": 0})


@pytest.mark.parametrize("value", [-5, 0, "4096", True, 4096.0], ids=json.dumps)
def test_max_position_embeddings_not_a_positive_integer_is_refused_at_load(model_dir, tmp_path, value):
    """-5 was "RuntimeError: zeros: Dimension size must be non-negative" in the model runner; 0 loaded
    the model, then every prompt "exceeds the context length 0"."""
    bad = _with_config(model_dir, tmp_path, max_position_embeddings=value)
    says = f"config.json: max_position_embeddings must be a positive integer, got {json.dumps(value)}"
    _refused_by_launcher_and_runner(bad, says)


@pytest.mark.parametrize(
    ("quantization_config", "named"),
    [({"quant_method": "fp8", "weight_block_size": [128, 128]}, ', quant_method "fp8"'), ({}, "")],
    ids=["fp8", "no-method"],
)
def test_a_checkpoint_stored_quantized_is_refused(model_dir, tmp_path, quantization_config, named):
    """A probe's find: float8 weights with their ``weight_scale_inv`` tensors were cast to floats
    without the scales (only a warning about the unused tensors, then nonsense), and GPTQ's packed
    tensors were "never loaded", blamed on config.json. From the launcher's check and the runner's."""
    bad = _with_config(model_dir, tmp_path, quantization_config=quantization_config)
    says = (
        f"config.json: the weights are stored quantized (quantization_config{named}), which minisgl "
        "does not load; give the model's unquantized checkpoint (--quantization fp8, int8 or int4 "
        "quantizes it at load)"
    )
    _refused_by_launcher_and_runner(bad, says)


def test_rope_scaling_beside_rope_parameters_saying_otherwise_is_refused(model_dir, tmp_path):
    """A probe's find: a linear ``rope_scaling`` beside transformers 5's ``rope_parameters`` (as
    adding the scaling to a config it saved gives) was silently ignored, where transformers reads
    the scaling (and drops rope_parameters' theta)."""
    parameters = json.loads((model_dir / "config.json").read_text())["rope_parameters"]
    scaling = {"rope_type": "linear", "factor": 4.0}
    bad = _with_config(model_dir, tmp_path, rope_scaling=scaling)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: config.json: rope_scaling {json.dumps(scaling)} and rope_parameters "
        f"{json.dumps(parameters)} disagree (transformers 5 reads rope_scaling and drops "
        "rope_parameters); keep one of them"
    )


def test_rope_scaling_beside_rope_parameters_saying_the_same_loads(model_dir, tmp_path):
    """The same settings under both keys (the older spelling ``type``, rope_theta in one only)
    are no disagreement; the model answers as without the copy."""
    parameters = json.loads((model_dir / "config.json").read_text())["rope_parameters"]
    same = {("type" if k == "rope_type" else k): v for k, v in parameters.items() if k != "rope_theta"}
    copy = _with_config(model_dir, tmp_path, rope_scaling=same)
    outputs = []
    for model in (model_dir, copy):
        with LLM(model, attn="torch", device="cpu", num_kv_tokens=512) as llm:
            outputs.append(
                llm.generate([[5, 6, 7]], llm.sampling_params(temperature=0, max_tokens=4))[0].token_ids
            )
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"tie_word_embeddings": "false"},
            "Validation error for field 'tie_word_embeddings': TypeError: Field 'tie_word_embeddings' "
            "expected bool, got str (value: 'false')",
        ),
        (
            {"rope_parameters": None, "rope_scaling": {"type": "linear"}},
            "Missing required keys in `rope_parameters` for 'rope_type'='linear': {'factor'}",
        ),
    ],
    ids=["tie-a-string", "linear-without-factor"],
)
def test_a_config_transformers_refuses_is_named_before_the_weights_load(model_dir, tmp_path, changes, says):
    """A probe's find: loading the tokenizer reads config.json through transformers, whose strict
    validators refused these after the weights had loaded, as "tokenizer files in DIR could not be
    loaded: Validation error for field 'tie_word_embeddings':" (the reason on a second line, cut;
    and "false" had built a model with tied embeddings first)."""
    bad = _with_config(model_dir, tmp_path, **changes)
    proc = _cli("generate", "--model", str(bad), "--device", "cpu", "--max-tokens", "2", "hi")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: --model {bad}: config.json: transformers refuses it: {says}"
    ]


def test_the_workers_name_config_json_where_transformers_refuses_it(model_dir, tmp_path):
    """Where the launcher did not check (Engine() alone), the tokenizer's load says config.json too."""
    from minisgl_core.checkpoint.formats import load_tokenizer_dir

    bad = _with_config(model_dir, tmp_path, tie_word_embeddings="false")
    with pytest.raises(ModelPathError) as err:
        load_tokenizer_dir(bad)
    assert str(err.value).startswith(
        f"{bad / 'config.json'}: transformers refuses it: Validation error for field 'tie_word_embeddings': "
        "TypeError: Field"
    )


def test_a_tokenizer_file_that_is_a_directory_is_named_before_the_weights_load(model_dir, tmp_path):
    bad = _with_config(model_dir, tmp_path)
    (bad / "tokenizer.json").unlink()
    (bad / "tokenizer.json").mkdir()
    proc = _cli("generate", "--model", str(bad), "--device", "cpu", "--max-tokens", "2", "hi")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: --model {bad}: tokenizer files in {bad} could not be loaded: tokenizer.json is not a file"
    ]


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tiny models of the decoder's other architectures (fused q/k/v, experts)."""
    root = tmp_path_factory.mktemp("archs")
    archs = ("Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM")
    return {arch: make_model_dir(root / arch, arch) for arch in archs}


@pytest.mark.parametrize("arch", ["Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"])
@pytest.mark.parametrize(
    ("field", "value"), [("hidden_size", "64"), ("num_hidden_layers", 2.0), ("num_key_value_heads", -2)]
)
def test_the_decoders_other_architectures_have_their_sizes_checked(
    decoder_dirs, tmp_path, arch, field, value
):
    """A probe's find: for Phi3, Mixtral and Qwen3-MoE these were a TypeError or ValueError traceback
    from the model's construction (the sizes were checked for the Llama names' architectures only)."""
    bad = _with_config(decoder_dirs[arch], tmp_path, **{field: value})
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: config.json: {field} must be a positive integer, got {json.dumps(value)}"
    )


@pytest.mark.parametrize(("kv_heads", "rows"), [(2**31, 68719476800), (1, 96)], ids=["2**31", "1"])
def test_phi3s_fused_qkv_projection_is_compared_with_config_json(decoder_dirs, tmp_path, kv_heads, rows):
    """A probe's find: Phi-3's fused qkv_proj ([64 + 2 x 32, 64] here) had no rule, and no other
    tensor's shape involves the KV heads: 2**31 of them was the allocator's RuntimeError for a
    17 TB tensor (on a machine that overcommits, the OOM killer) before a weight was read."""
    bad = _with_config(decoder_dirs["Phi3ForCausalLM"], tmp_path, num_key_value_heads=kv_heads)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: weight model.layers.0.self_attn.qkv_proj.weight in model.safetensors has "
        f"shape [128, 64], config.json implies [{rows}, 64] ((num_attention_heads + 2 x num_key_value_heads) x "
        "head_dim, hidden_size): config.json does not describe these weights"
    )


@pytest.mark.parametrize("arch", ["Phi3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"])
def test_the_decoders_other_architectures_have_their_layers_counted(decoder_dirs, tmp_path, arch):
    """num_hidden_layers 1 over two layers of weights loaded the first layer only and answered
    (a warning of unused tensors the one sign)."""
    bad = _with_config(decoder_dirs[arch], tmp_path, num_hidden_layers=1)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: config.json says num_hidden_layers 1, the weights also hold model.layers.1.* "
        "(2 layers in all): config.json does not describe these weights"
    )


@pytest.mark.parametrize("value", [float("nan"), [8], True, "7", 0, 8.0], ids=json.dumps)
@pytest.mark.parametrize(
    ("arch", "key"),
    [
        ("Qwen3MoeForCausalLM", "num_experts"),  # (Qwen's checkpoints' name)
        ("Qwen3MoeForCausalLM", "num_local_experts"),  # (transformers 5's)
        ("Qwen3MoeForCausalLM", "decoder_sparse_step"),
        ("MixtralForCausalLM", "num_local_experts"),
    ],
)
def test_an_expert_count_not_a_positive_integer_is_refused_naming_it(
    decoder_dirs, tmp_path, arch, key, value
):
    """A probe's find: the plugins took int() of the experts' counts, so "7" was silently 7 experts
    (then a loader's error about an expert 7 the weights hold), NaN or a list a PluginFailure from
    the model's construction, 0 a dense model "never loaded"."""
    bad = _with_config(decoder_dirs[arch], tmp_path, **{key: value})
    says = f"config.json: {key} must be a positive integer, got {json.dumps(value)}"
    _refused_by_launcher_and_runner(bad, says)


@pytest.mark.parametrize(
    ("arch", "key", "tensor"),
    [
        ("MixtralForCausalLM", "num_local_experts", "block_sparse_moe.experts.{e}.w"),
        ("Qwen3MoeForCausalLM", "num_local_experts", "mlp.experts.{e}."),
    ],
)
def test_fewer_experts_than_the_weights_hold_names_the_tensor(decoder_dirs, tmp_path, arch, key, tensor):
    """An IndexError traceback from the experts' loader (a probe's find)."""
    config = json.loads((decoder_dirs[arch] / "config.json").read_text())
    experts = config[key]
    bad = _with_config(decoder_dirs[arch], tmp_path, **{key: experts - 1, "num_experts_per_tok": 1})
    with pytest.raises(ModelPathError) as err:  # (the launcher's check: the router's shape says it)
        LLM(bad, attn="torch", device="cpu")
    assert f"config.json implies [{experts - 1}, 64] ({key}" in str(err.value) or (
        f"config.json implies [{experts - 1}, 64] (num_experts" in str(err.value)
    ), str(err.value)
    with pytest.raises(ModelPathError) as err:  # the loader's, where the launcher did not check
        Engine(EngineConfig(model=str(bad), attn="torch", device="cpu"), ParallelContext(), Plugins.load())
    says = str(err.value)  # (the first of the expert's tensors the file holds)
    assert says.startswith(f"--model {bad}: weight model.layers.0.{tensor.format(e=experts - 1)}"), says
    assert says.endswith(
        f".weight: the checkpoint holds expert {experts - 1}; the model was built with {experts - 1} "
        "experts (config.json does not describe these weights?)"
    )


@pytest.mark.parametrize(
    ("arch", "key", "tensor", "shape", "implied"),
    [
        ("MixtralForCausalLM", "intermediate_size", "block_sparse_moe.experts.0.w1", [32, 64], [2**31, 64]),
        ("MixtralForCausalLM", "num_local_experts", "block_sparse_moe.gate", [8, 64], [2**31, 64]),
        ("Qwen3MoeForCausalLM", "moe_intermediate_size", "mlp.experts.0.down_proj", [64, 32], [64, 2**31]),
        ("Qwen3MoeForCausalLM", "num_local_experts", "mlp.gate", [8, 64], [2**31, 64]),
    ],
)
def test_an_expert_size_the_weights_do_not_have_names_the_tensor(
    decoder_dirs, tmp_path, arch, key, tensor, shape, implied
):
    """A probe's find: the experts' sizes were not compared with the weights, and the model built
    its experts from config.json first: 2**31 was a PluginFailure from the allocator (a smaller
    size, all the memory) before a weight was read."""
    bad = _with_config(decoder_dirs[arch], tmp_path, **{key: 2**31})
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert (
        f": weight model.layers.0.{tensor}.weight in model.safetensors has shape {shape}, config.json "
        in str(err.value)
    )
    assert f"implies {implied} (" in str(err.value) and str(err.value).endswith(
        "config.json does not describe these weights"
    )


@pytest.fixture(scope="module")
def olmo2_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("olmo2") / "olmo2", "Olmo2ForCausalLM")


def test_olmo2s_whole_projection_qk_norms_fit_its_layout(olmo2_dir):
    """OLMo 2's q_norm/k_norm span the whole projections (64 and 32 values here, not head_dim's
    16) and each layer has a post_feedforward_layernorm: its checkpoints pass the layout's check."""
    tensors = read_headers(olmo2_dir)
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (64,)
    check_shapes(json.loads((olmo2_dir / "config.json").read_text()), tensors)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (dict(num_key_value_heads=4), "weight model.layers.0.self_attn.k_norm.weight in model.safetensors has "
                                      "shape [32], config.json implies [64] (num_key_value_heads x head_dim)"),
        (dict(hidden_size=96), "has shape [1024, 64], config.json implies [1024, 96] (vocab_size, hidden_size)"),
        (dict(num_hidden_layers=1), "config.json says num_hidden_layers 1, the weights also hold model.layers.1.*"),
    ],
)  # fmt: skip
def test_an_olmo2_config_that_contradicts_its_weights_is_named(olmo2_dir, tmp_path, changes, says):
    bad = _with_config(olmo2_dir, tmp_path, **changes)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert says in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def gemma2_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("gemma2") / "gemma2", "Gemma2ForCausalLM", head_dim=24)


def test_gemma2s_four_norms_and_its_own_head_dim_fit_its_layout(gemma2_dir):
    """Gemma 2's pre_feedforward_layernorm (beside OLMo 2's post_feedforward one) and a head_dim
    that is not hidden / heads (24 x 4 heads beside hidden 64): its checkpoints pass the check."""
    tensors = read_headers(gemma2_dir)
    assert tensors["model.layers.0.pre_feedforward_layernorm.weight"].shape == (64,)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (96, 64)
    check_shapes(json.loads((gemma2_dir / "config.json").read_text()), tensors)


def test_a_gemma3_config_that_contradicts_its_per_head_qk_norms_is_named(tmp_path):
    """Gemma 3's q_norm/k_norm hold head_dim weights (one head's): a config.json head_dim that
    contradicts them is named before the model is built (the q/k/v/o shapes agree here)."""
    model_dir = make_model_dir(tmp_path / "gemma3", "Gemma3ForCausalLM", head_dim=24)
    tensors = read_headers(model_dir)
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (24,)
    check_shapes(json.loads((model_dir / "config.json").read_text()), tensors)
    bad = _with_config(model_dir, tmp_path, head_dim=16, num_attention_heads=6, num_key_value_heads=3)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    says = (
        "weight model.layers.0.self_attn.k_norm.weight in model.safetensors has shape [24], config.json "
        "implies [16] (head_dim)"
    )
    assert says in str(err.value), str(err.value)


def test_a_gemma2_config_that_contradicts_its_weights_is_named(gemma2_dir, tmp_path):
    bad = _with_config(gemma2_dir, tmp_path, head_dim=16)
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    says = (
        "weight model.layers.0.self_attn.k_proj.weight in model.safetensors has shape [48, 64], config.json "
        "implies [32, 64] (num_key_value_heads x head_dim, hidden_size)"
    )
    assert says in str(err.value), str(err.value)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


@pytest.mark.parametrize("value", ["x", None, 1.5], ids=json.dumps)
def test_a_max_window_layers_not_a_whole_number_is_refused_naming_it(llama_dir, tmp_path, value):
    """A probe's find: under ``use_sliding_window`` in a config whose class transformers does not
    validate it for (a Llama's), "x" or null was int()'s ValueError or TypeError traceback from
    the model's construction, and 1.5 silently slid from layer 1 (transformers' rule: from 2)."""
    bad = _with_config(
        llama_dir, tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=value
    )
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == (
        f"model={str(bad)!r}: LlamaForCausalLM cannot be built from this model's config: max_window_layers "
        f"{json.dumps(value)} is not supported: the first layer with the sliding window must be a whole "
        "number (or leave the key out: 28)"
    )


def test_a_negative_max_window_layers_slides_every_layer(model_dir, tmp_path):
    """transformers takes it (Qwen3's config validates it as an int) and slides every layer from it:
    every layer. The frozenset of the range from -2**62 was a MemoryError."""
    # (without layer_types, which transformers 5 derives from it)
    window = dict(use_sliding_window=True, sliding_window=4, max_window_layers=-(2**62), layer_types=None)
    bad = _with_config(model_dir, tmp_path, **window)
    with LLM(bad, attn="torch", device="cpu", num_kv_tokens=512) as llm:
        assert set(llm.engine.runner.model.kv_spec.window_layers) == {0, 1}
        output = llm.generate([[5, 6, 7]], llm.sampling_params(temperature=0, max_tokens=3))[0]
    assert len(output.token_ids) == 3


@pytest.fixture(scope="module")
def granite_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("granite") / "granite", "GraniteForCausalLM")


@pytest.mark.parametrize(
    ("arch", "key", "value"),
    [
        ("Gemma2ForCausalLM", "query_pre_attn_scalar", 0),
        ("Gemma2ForCausalLM", "query_pre_attn_scalar", -1),
        ("Gemma2ForCausalLM", "final_logit_softcapping", 1e308),
        ("Gemma2ForCausalLM", "attn_logit_softcapping", 1e-320),
        ("GraniteForCausalLM", "embedding_multiplier", 1e308),
        ("GraniteForCausalLM", "embedding_multiplier", 1e-320),
        ("GraniteForCausalLM", "attention_multiplier", 1e308),
        ("GraniteForCausalLM", "logits_scaling", 1e-320),
    ],
    ids=lambda value: json.dumps(value)[:24],
)
def test_an_architectures_scale_that_cannot_be_right_is_refused(
    gemma2_dir, granite_dir, tmp_path, arch, key, value
):
    """A probe's find: Gemma 2's query_pre_attn_scalar 0 was a ZeroDivisionError (a PluginFailure)
    from the model's build and -1 a complex softmax scale that failed the first decode step, after
    the model had loaded; a soft-cap or Granite multiplier of 1e308 (infinite in float32) or 1e-320
    (0 in float32) loaded a model that answered token 0, or was blamed on "the checkpoint is
    corrupt"."""
    model = gemma2_dir if arch == "Gemma2ForCausalLM" else granite_dir
    bad = _with_config(model, tmp_path, **{key: value})
    with pytest.raises(ModelPathError) as err:
        LLM(bad, attn="torch", device="cpu")
    assert str(err.value) == f"model={str(bad)!r}: config.json: {key} {SCALE_SAYS}{json.dumps(value)}"

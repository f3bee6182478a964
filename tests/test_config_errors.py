"""Clear errors for bad model directories and bad engine settings, before any weight is loaded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from minisgl_core import LLM
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.config import MAX_GRAMMAR_THREADS, ConfigError, EngineConfig
from minisgl_core.config_args import cli_message
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.runner.memory_check import MemoryAsk, check_fits
from minisgl_core.runner.model_runner import pick_attention
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing.cli_runner import run_cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


def test_unknown_architecture_lists_installed_and_the_plugin_to_install(model_dir, tmp_path):
    bad = tmp_path / "mamba"
    bad.mkdir()
    for f in model_dir.iterdir():
        (bad / f.name).symlink_to(f)
    (bad / "config.json").unlink()
    config = json.loads((model_dir / "config.json").read_text()) | {"architectures": ["MambaForCausalLM"]}
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(PluginError) as err:
        LLM(bad, attn="torch", device="cpu")
    message = str(err.value)
    assert "MambaForCausalLM" in message and "LlamaForCausalLM" in message and "Qwen3ForCausalLM" in message
    # (no index has a minisgl-plugin-mamba, which it said to pip install)
    assert message.endswith("; install a plugin that registers it") and "pip install" not in message


@pytest.mark.parametrize("option", ["attn", "cache", "policy", "quantization", "grammar_backend"])
def test_an_unknown_plugin_name_is_a_value_error_as_other_bad_settings_are(model_dir, option):
    """``LLM(attn="nope")`` raised a PluginError, a RuntimeError, where every other bad keyword
    (``max_running_requests=-1``) raises a ConfigError, a ValueError: ``except ValueError`` missed
    it. A name no plugin registers is both now."""
    with pytest.raises(ValueError, match=f"unknown {option}='nope'; installed: ") as err:
        LLM(model_dir, device="cpu", **{option: "nope"})
    assert isinstance(err.value, PluginError)


def test_a_model_name_too_long_to_look_up_is_not_found():
    """It was an OSError traceback ("File name too long") from every command."""
    from minisgl_core.checkpoint.resolve import ModelNotFound, resolve_model

    with pytest.raises(ModelNotFound, match=": no such file or directory"):
        resolve_model("a" * 5000)


def test_a_step_trace_name_too_long_to_look_up_is_refused_naming_the_field():
    """It was an OSError traceback ("File name too long") from pathlib's is_dir, which raises
    ENAMETOOLONG where it answers False for a missing path (serve, generate, the benches)."""
    long = "/tmp/" + "x" * 300
    with pytest.raises(ConfigError, match="File name too long") as err:
        EngineConfig(model="x", step_trace=long)
    assert err.value.fields == ("step_trace",)
    assert cli_message(err.value).startswith(f"--step-trace {long!r}: cannot be opened for appending")


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(ModelPathError, match="the directory has no config.json"):
        LLM(tmp_path, attn="torch", device="cpu")


def _bad_models(tmp_path, model_dir) -> dict[str, tuple[str, str]]:
    """Bad --model values: name -> (path, what the one-line error must say)."""
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{not json")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((model_dir / "config.json").read_text())
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hello")
    empty = tmp_path / "empty"
    empty.mkdir()
    return {
        "missing": (str(tmp_path / "nowhere"), "no such file or directory"),
        "no config": (str(empty), "the directory has no config.json"),
        "unreadable config": (str(garbage), "config.json is unreadable"),
        "no weights": (str(no_weights), "no weights in the directory"),
        "not a model file": (str(text_file), "is a file, not a model"),
        "a device": ("/dev/null", "is not a file or a directory"),
    }


def test_bad_model_raises_one_clear_error_offline(model_dir, tmp_path):
    for path, says in _bad_models(tmp_path, model_dir).values():
        with pytest.raises(ModelPathError) as err:
            LLM(path, attn="torch", device="cpu")
        assert says in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).startswith(f"model={path!r}")


@pytest.mark.parametrize("command", ["serve", "shell", "generate", "bench"])
def test_bad_model_is_one_line_on_the_command_line(model_dir, tmp_path, command):
    """Every command that loads a model: exit code 2 and one line naming the problem, no traceback
    (every kind of bad path through serve, one through the others: each run imports torch)."""
    args = {"serve": ["serve", "--port", "0"], "shell": ["shell"], "generate": ["generate", "hi"],
            "bench": ["bench", "offline", "--num-requests", "1"]}[command]  # fmt: skip
    bad = _bad_models(tmp_path, model_dir)
    for name, (path, says) in bad.items():
        if command != "serve" and name != "missing":
            continue
        proc = run_cli([*args, "--model", path, "--device", "cpu"])
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert (
            len(lines) == 1 and lines[0].startswith(f"minisgl: error: --model {path}") and says in lines[0]
        ), lines


@pytest.mark.parametrize("command", [["generate", "hi"], ["serve", "--port", "0"], ["bench", "offline"]])
def test_an_empty_model_is_refused_not_read_as_the_working_directory(model_dir, tmp_path, command):
    """``--model ""`` was the working directory: a model there was loaded, anywhere else the
    error spoke of a model '.' no one had named."""
    cwd = model_dir if command[0] == "generate" else tmp_path  # (serve would have served it)
    proc = run_cli([*command, "--model", "", "--device", "cpu"], cwd=cwd)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [
        "minisgl: error: the model path (--model) is empty; give a model directory, a .gguf file, ORG/NAME "
        "on a Hugging Face hub or 'demo', or leave --model out for the default model"
    ]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(dtype="float64"), "dtype"),
        (dict(page_size=3), "page_size"),
        (dict(max_prefill_tokens=0), "max_prefill_tokens"),
        (dict(kv_memory_fraction=1.5), "kv_memory_fraction"),
        (dict(max_context_len=0), "max_context_len"),
        (dict(max_context_len=1), "max_context_len"),  # (started, then refused every request)
        (dict(num_kv_tokens=0), "num_kv_tokens"),
        (dict(num_kv_tokens=20, page_size=16), "num_kv_tokens"),
        (dict(cuda_graph_max_bs=-1), "cuda_graph_max_bs"),
        (dict(attn="a,b,c"), "attn"),
        (dict(attn="torch,"), "attn"),
        # (auto in a pair: "unknown --attn 'auto'", suggesting pip install minisgl-plugin-auto)
        (dict(attn="auto,torch"), "attn"),
        (dict(attn="torch, auto"), "attn"),
        (dict(attn="torch,AUTO"), "attn"),  # (in another case too: "did you mean 'auto'?")
        (dict(device="tpu"), "device"),
        (dict(device="meta"), "device"),
        (dict(tp_size=0), "tp_size"),
        (dict(quantization=""), "quantization"),  # (ran unquantized without a word)
        (dict(quantization="  "), "quantization"),
    ],
)
def test_bad_engine_settings_name_the_field(options, field):
    with pytest.raises(ConfigError, match=field) as err:
        EngineConfig(model="x", **options)
    assert field in err.value.fields


def test_the_smallest_context_serves_a_one_token_prompt_and_one_output_token(model_dir):
    """``max_context_len=1`` started and then refused every request; 2, the least it now takes,
    serves a one-token prompt and its one output token."""
    with pytest.raises(
        ConfigError, match=r"max_context_len must be >= 2 \(a one-token prompt and one output"
    ):
        LLM(model_dir, device="cpu", attn="torch", max_context_len=1)
    with LLM(model_dir, device="cpu", attn="torch", max_context_len=2) as llm:
        [out] = llm.generate([[5]], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
        assert len(out.token_ids) == 1 and out.finish_reason == "length"


def test_plugin_options_must_be_a_dict_and_none_means_none(model_dir):
    """LLM(plugin_options=None) was a TypeError from the check of the option names, and a
    string's characters were taken for option names."""
    for value in ("x", ["a"], 3):
        with pytest.raises(ConfigError) as err:
            LLM(model_dir, attn="torch", device="cpu", plugin_options=value)
        assert str(err.value) == (
            f"plugin_options must be a dict of plugin options by name (or unset), got {value!r}"
        )
        assert err.value.fields == ("plugin_options",)
    with LLM(model_dir, attn="torch", device="cpu", plugin_options=None) as llm:
        assert llm.config.plugin_options == {}


def test_the_command_line_names_the_flag_not_the_field():
    with pytest.raises(ConfigError) as err:
        EngineConfig(model="x", speculative_ngram_min=3, speculative_ngram_max=2)
    assert cli_message(err.value) == (
        "speculative n-gram sizes must satisfy 1 <= --speculative-ngram-min <= --speculative-ngram-max, "
        "got 3 and 2"
    )
    with pytest.raises(ConfigError) as err:
        EngineConfig(model="x", tp_size=0)
    assert cli_message(err.value) == "--tp must be >= 1, got 0"
    assert EngineConfig(model="x", device="cuda:1", attn=" fa3 , fi ").device == "cuda:1"


def test_grammar_threads_are_bounded():
    for threads in (None, 1, 7, MAX_GRAMMAR_THREADS):
        assert EngineConfig(model="x", grammar_threads=threads).grammar_threads == threads
    for threads in (0, -3, MAX_GRAMMAR_THREADS + 1, 10_000):
        with pytest.raises(ConfigError) as err:
            EngineConfig(model="x", grammar_threads=threads)
        assert cli_message(err.value) == (
            f"--grammar-threads must be in [1, {MAX_GRAMMAR_THREADS}] (unset: half the CPUs, 1 to 16), "
            f"got {threads}"
        )


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(args)


#: (command, its arguments and the bad flags, what the one line says); every command that builds
#: an engine config from flags, and each kind of check (engine config, device, server, bench)
BAD_FLAGS = [
    ("serve", ["--port", "0", "--page-size", "3"], "--page-size must be a power of two >= 1, got 3"),
    ("serve", ["--port", "0", "--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N; got 'tpu'"),
    ("generate", ["hi", "--device", "cpu:1"], "--device must be auto, cpu, cuda or cuda:N; got 'cpu:1'"),
    *([] if torch.cuda.is_available() else [
        ("bench", ["offline", "--device", "cuda"], "--device cuda was asked for but CUDA is not available here"),
    ]),
    ("serve", ["--port", "0", "--nnodes", "2"], "--nnodes > 1 needs --dist-init-addr"),
    # an installed backend this machine cannot run (the scheduler refused it after start-up)
    *([] if torch.cuda.is_available() else [
        ("serve", ["--port", "0", "--attn", "fi"], "--attn fi cannot run on cpu: the fi attention backend runs on CUDA"),
        ("generate", ["hi", "--attn", "fi"], "not on 'cpu'; use --attn auto to pick one that does"),
        ("serve", ["--port", "0", "--attn", "torch,fi"], "--attn fi cannot run on cpu"),
        ("shell", ["--attn", "fa3"], "--attn fa3 cannot run on cpu"),
    ]),
    ("serve", ["--port", "0", "--tp", "2", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:1"],
     "--node-rank must be in [0, --nnodes=2), got 2"),
    ("serve", ["--port", "0", "--tp", "2", "--tp-peer-timeout", "0.5"], "--tp-peer-timeout must be at least 2 seconds, got 0.5"),
    ("serve", ["--port", "0", "--tp", "2", "--tp-peer-timeout", "nan"], "--tp-peer-timeout must be at least 2 seconds, got nan"),
    ("serve", ["--port", "0", "--max-body-bytes", "0"], "--max-body-bytes must be at least 1"),
    ("serve", ["--port", "0", "--host", "nonexistent.invalid"], "--host 'nonexistent.invalid' is not an address"),
    ("serve", ["--port", "0", "--grammar-backend", "nope"], "unknown --grammar-backend 'nope'; installed: llguidance, xgrammar"),
    ("serve", ["--port", "0", "--chat-template", "/no/such.jinja"], "--chat-template: cannot read /no/such.jinja"),
    # (a name that is neither a file nor a bundled template: the bundled ones are listed)
    ("serve", ["--port", "0", "--chat-template", "chatml"],
     "--chat-template: cannot read chatml: No such file or directory (give a template file, or a bundled "
     "template's name: chatml-tools)"),
    # (the tiny model: 4 heads, 2 KV heads; a worker's traceback before)
    ("serve", ["--port", "0", "--tp", "3"],
     "--tp 3: the model's 4 attention heads (2 KV heads) do not split evenly over 3 ranks; use --tp 1 or 2 or 4"),
    # (an empty parser name served without the parser, silently)
    ("serve", ["--port", "0", "--tool-call-parser", ""], "--tool-call-parser needs a name; installed: hermes, "),
    ("shell", ["--reasoning-parser", ""], "--reasoning-parser needs a name; installed: "),
    # (an empty key served without authentication, silently)
    ("serve", ["--port", "0", "--api-key", ""], "--api-key is empty"),
    # (keys no client can send: every request was a 401; bench serve's a UnicodeEncodeError)
    ("serve", ["--port", "0", "--api-key", "abc "], "--api-key (or MINISGL_API_KEY) has spaces around it"),
    ("serve", ["--port", "0", "--api-key", "clé"], "--api-key (or MINISGL_API_KEY) holds 'é', which an HTTP header"),
    ("shell", ["--speculative-algorithm", "ngram", "--speculative-ngram-min", "3", "--speculative-ngram-max", "2"],
     "--speculative-ngram-min <= --speculative-ngram-max"),
    # (speculative decoding's tuning without the algorithm was ignored silently: decoding ran without it)
    ("generate", ["hi", "--speculative-num-draft-tokens", "8"], "--speculative-num-draft-tokens needs --speculative-algorithm (ngram)"),
    ("serve", ["--port", "0", "--speculative-ngram-max", "2"], "--speculative-ngram-max needs --speculative-algorithm (ngram)"),
    # (10**8 exhausted the memory building an index per n-gram size; a 70-bit seed was torch's traceback)
    ("generate", ["hi", "--speculative-algorithm", "ngram", "--speculative-ngram-max", "100000"],
     "--speculative-ngram-max must be at most 64, got 100000"),
    ("generate", ["hi", "--seed", str(10**21)], "--seed must be an integer in [-2**63, 2**64-1]"),
    # (tracebacks: the step trace's after the model had loaded, urllib's, the grammar backend loader's)
    ("generate", ["hi", "--step-trace", "/nonexistent/dir/steps.jsonl"], "--step-trace '/nonexistent/dir/steps.jsonl': its directory does not exist"),
    ("generate", ["hi", "--step-trace", "/tmp"], "--step-trace '/tmp': is a directory"),
    # (taken as the flag left out: no trace, or $MINISGL_STEP_TRACE's, silently)
    ("generate", ["hi", "--step-trace", ""], "--step-trace is empty: give a file to append one JSON line per step to, or leave --step-trace out"),
    # (a file that cannot be opened to append to: the engine's PermissionError or OSError traceback
    # once the model had loaded, from the scheduler process under serve)
    ("serve", ["--port", "0", "--step-trace", "/proc/self/status"], "--step-trace '/proc/self/status': cannot be opened for appending"),
    ("shell", ["--url", "notaurl"], "--url 'notaurl': give the server's address, e.g. http://127.0.0.1:8000"),
    ("bench grammar", ["--grammar-backend", "bogus"], "unknown --grammar-backend 'bogus'; installed: llguidance, xgrammar"),
    # (--shape won silently: a random-weight model of that shape was built and benchmarked)
    ("bench", ["offline", "--shape", "qwen3-0.6b"], "give --shape or --model, not both"),
    # (the offline LLM's refusal of a TP size was a traceback)
    ("bench", ["cpu", "--tp", "2"], "bench cpu runs the offline LLM in one process: --tp 1, not 2"),
    # (serve took the shell's settings without --shell and used them for nothing)
    ("serve", ["--port", "0", "--temperature", "0.5", "--system", "be brief"],
     "--temperature, --system: the terminal chat's settings; add --shell (or run `minisgl shell`)"),
    # (a misspelt name left the plugin it meant loaded, silently)
    ("serve", ["--port", "0", "--disable-plugin", "xgramar"], "no plugin named 'xgramar' to disable; installed: "),
    ("bench", ["offline", "--num-requests", "1", "--disable-plugin", "nope"], "no plugin named 'nope' to disable"),
    # (the model's own plugin disabled: serve's scheduler process refused it once started, exit code 1, said twice)
    ("serve", ["--port", "0", "--disable-plugin", "llama"],
     "model architecture 'LlamaForCausalLM' is unavailable: plugin 'llama' (minisgl-plugin-llama 0.1.0) is disabled"),
    # (generate and bench offline ignored --disable-plugin: every plugin loaded, torch attention ran)
    ("generate", ["hi", "--disable-plugin", "torch", "--attn", "torch"], "--attn 'torch' is unavailable: plugin 'torch'"),
    # (each turn was an error once the model had loaded)
    ("shell", ["--max-tokens", "0"], "--max-tokens must be an integer in [1, 2**63-1], got 0"),
    ("serve", ["--port", "0", "--shell", "--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
    ("generate", ["hi", "--tp", "2"], "--tp 2: minisgl generate runs one process"),
    ("generate", ["hi", "--attn", "torch,torch,torch"], "--attn takes NAME, PREFILL,DECODE or auto"),
    # (it said "unknown --attn 'AUTO'; ...; did you mean --attn 'auto'?", which a pair refuses)
    ("generate", ["hi", "--attn", "torch,AUTO"],
     "--attn takes NAME, PREFILL,DECODE or auto; got 'torch,AUTO': auto picks both backends, so it stands alone"),
    ("generate", ["hi", "--num-kv-tokens", "1"], "--num-kv-tokens must hold two pages at least"),
    ("generate", ["hi", "--max-tokens", "0"], "--max-tokens must be an integer in [1, 2**63-1], got 0"),
    ("generate", ["hi", "--temperature", "-1"], "--temperature must be >= 0, got -1.0"),
    ("generate", ["hi", ""], "a prompt is empty: give each prompt some text"),
    ("bench", ["offline", "--num-requests", "1", "--max-context-len", "0"], "--max-context-len must be >= 2"),
    # (started, then refused every request: a one-token prompt and one output token need 2)
    ("serve", ["--port", "0", "--max-context-len", "1"],
     "--max-context-len must be >= 2 (a one-token prompt and one output token), or unset, got 1"),
    ("bench", ["offline", "--tp", "2", "--grammar-schema", "builtin"], "--grammar-schema runs with --tp 1 only"),
    # (the TP run measured neither and said nothing)
    ("bench", ["offline", "--num-requests", "1", "--tp", "2", "--decode-latency"], "--decode-latency runs with --tp 1 only"),
    ("bench", ["offline", "--num-requests", "1", "--tp", "2", "--profile", "/tmp/minisgl-never-written.prof"],
     "--profile runs with --tp 1 only"),
    # (bench offline checked no heads: every rank's traceback)
    ("bench", ["offline", "--num-requests", "1", "--tp", "3"],
     "--tp 3: the model's 4 attention heads (2 KV heads) do not split evenly over 3 ranks; use --tp 1 or 2 or 4"),
    ("bench", ["offline", "--num-requests", "1", "--piecewise-cuda-graph-max-tokens", "-1"],
     "--piecewise-cuda-graph-max-tokens must be >= 0"),
    ("generate", ["hi", "--grammar-threads", "0"], "--grammar-threads must be in [1, 64]"),
    ("serve", ["--port", "0", "--grammar-threads", "65"], "--grammar-threads must be in [1, 64]"),
    ("bench", ["cpu", "--no-transformers", "--engine-arg", "page-size"], "--engine-arg takes KEY=VALUE"),
    ("bench", ["cpu", "--no-transformers", "--engine-arg", "pagesize=4"], "--engine-arg pagesize: not an LLM option"),
    ("bench grammar", ["--grammar-threads", "0"],
     "--grammar-threads must be in [1, 64] (unset: half the CPUs, 1 to 16), got 0"),
    # (a KeyError once the run was over: a path had no timed step)
    *[("bench grammar", ["--steps", steps, "--warm-steps", warm],
       f"--steps must be at least 2, or 3 with --warm-steps 0 (got {steps} with {warm}): the serial and "
       "batched paths take turns, and the first step has nothing to accept") for steps, warm in [("1", "5"), ("2", "0")]],
    # (a plugin not installed: the scheduler process refused it once started, exit code 1, said twice)
    ("serve", ["--port", "0", "--cache", "nosuch"],
     "unknown --cache 'nosuch'; installed: naive, radix; install a plugin that registers it"),
    # (said "pip install minisgl-plugin-AUTO", a package no index has)
    ("serve", ["--port", "0", "--attn", "AUTO"], "unknown --attn 'AUTO'; installed: fa3, fi, torch, triton; did you mean --attn 'auto'?"),
    ("serve", ["--port", "0", "--attn", "torch,nosuch"], "unknown --attn 'nosuch'; installed: fa3, fi, torch, triton;"),
    ("shell", ["--policy", "nosuch"], "unknown --policy 'nosuch'; installed: lpm, prefill-first, priority;"),
    ("serve", ["--port", "0", "--quantization", "nosuch"], "unknown --quantization 'nosuch'; installed: fp8, "),
    ("bench", ["offline", "--num-requests", "1", "--tp", "2", "--cache", "nosuch"], "unknown --cache 'nosuch'"),
    ("generate", ["hi", "--attn", "nosuch"], "unknown --attn 'nosuch'; installed: fa3, fi, torch, triton;"),
]  # fmt: skip


def test_a_tp_size_the_mlp_width_refuses_is_one_line_naming_the_sizes_that_fit(tmp_path):
    """The heads split over 4 ranks, the MLP's 6 columns do not: --tp 4 was a rank's traceback
    ("output size of size 6 is not divisible by tp_size=4"), and the heads' message had offered
    such a --tp as a fix (the default model: --tp 9 for its 9 heads and 1,536 columns)."""
    model = make_model_dir(tmp_path / "m", "LlamaForCausalLM", intermediate_size=6)
    for command in (["serve", "--port", "0"], ["bench", "offline", "--num-requests", "1"]):
        proc = _cli(*command, "--model", str(model), "--device", "cpu", "--tp", "4")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.splitlines() == [
            "minisgl: error: --tp 4: the model's MLP width (intermediate_size 6) does not split evenly "
            "over 4 ranks; use --tp 1 or 2"
        ]


def test_the_mlp_widths_tp_splits():
    from minisgl_core.config_args import _sharded_mlp_sizes

    assert _sharded_mlp_sizes({"intermediate_size": 1536}) == {"intermediate_size": 1536}
    # Qwen3-MoE: the experts' width; the dense one only where a layer is dense (the plugin's rule)
    moe = {
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_hidden_layers": 4,
    }
    both = {"moe_intermediate_size": 768, "intermediate_size": 6144}
    assert _sharded_mlp_sizes(moe) == {"moe_intermediate_size": 768}
    assert _sharded_mlp_sizes({**moe, "decoder_sparse_step": None}) == {"moe_intermediate_size": 768}
    assert _sharded_mlp_sizes({**moe, "mlp_only_layers": [9]}) == {
        "moe_intermediate_size": 768
    }  # no such layer
    assert _sharded_mlp_sizes({**moe, "mlp_only_layers": [0]}) == both
    assert _sharded_mlp_sizes({**moe, "decoder_sparse_step": 2}) == both
    assert _sharded_mlp_sizes({**moe, "num_experts": 0}) == {"intermediate_size": 6144}  # every layer dense
    # Mixtral: its experts take intermediate_size
    assert _sharded_mlp_sizes({"intermediate_size": 14336, "num_local_experts": 8}) == {
        "intermediate_size": 14336
    }
    assert _sharded_mlp_sizes({"intermediate_size": None}) == {}


@pytest.mark.parametrize(
    ("command", "args", "says"), BAD_FLAGS, ids=lambda v: v if isinstance(v, str) else None
)
def test_a_setting_the_engine_refuses_is_one_line_on_the_command_line(model_dir, command, args, says):
    """Exit code 2 and one line naming the flag, as argparse's own errors; no traceback, and
    nothing started (no log line before it)."""
    if command == "bench grammar":  # no engine: no model, no device
        proc = _cli("bench", "grammar", *args)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [f"minisgl: error: {says}"], proc.stderr
        return
    device = [] if "--device" in args else ["--device", "cpu"]
    proc = _cli(command, *args, "--model", str(model_dir), *device)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minisgl: error: ") and says in lines[0], lines
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("command", "code"),
    [(["shell", "--url", "http://127.0.0.1:9"], 2), (["bench", "serve", "--url", "http://127.0.0.1:9"], 2)],
)
def test_a_client_refuses_an_api_key_no_header_can_carry(command, code):
    """A server refused every request with such a key; bench serve's client was a UnicodeEncodeError."""
    proc = _cli(*command, "--api-key", "clé")
    assert proc.returncode == code, proc.stderr
    assert "holds 'é', which an HTTP header cannot carry" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("plugin", "says"),
    [
        ("torch", "--attn 'torch' is unavailable: plugin 'torch' (minisgl-plugin-torch 0.1.0) is in conflict: "),
        ("radix", "--cache 'radix' is unavailable: plugin 'radix' (minisgl-plugin-radix 0.1.0) is in conflict: "),
    ],
)  # fmt: skip
def test_a_default_plugin_in_conflict_is_one_line_before_anything_starts(model_dir, tmp_path, plugin, says):
    """A second distribution with an entry point named ``torch`` (so neither loads): ``serve``
    without --attn started and loaded the model, then the scheduler refused --attn auto's torch,
    while a misspelt --policy was one line from the launcher (found by a probe)."""
    site = tmp_path / "site"
    (site / "t14_shadow").mkdir(parents=True)
    (site / "t14_shadow" / "__init__.py").write_text('MINISGL_API = "2.0"\n')
    info = site / "minisgl_test_shadow-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: minisgl-test-shadow\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[minisgl.plugins]\n{plugin} = t14_shadow\n")
    proc = run_cli(
        ["serve", "--port", "0", "--model", str(model_dir), "--device", "cpu"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"minisgl: error: {says}"), lines
    assert "minisgl-test-shadow 0.1.0, so neither is loaded" in lines[0], lines
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_attn_auto_resolves_in_the_launcher_what_the_runner_will():
    """On a GPU the runner imports each installed backend of both auto lists (and torch for a
    role with none installed): the launcher resolves the same ones, without starting CUDA."""
    from minisgl_core.config_args import auto_attention_names

    plugins = Plugins.load()
    assert auto_attention_names("cpu", plugins) == ("torch",)
    assert auto_attention_names("cuda:1", plugins) == ("fa3", "fi", "triton")
    assert auto_attention_names("cuda", Plugins.load(disable=["fa3", "fi"])) == ("torch", "triton")
    assert auto_attention_names("cuda", Plugins.load(disable=["fa3", "fi", "triton"])) == ("torch",)


def test_attn_auto_the_launcher_checks_what_the_runner_can_pick():
    """The launcher's names for ``--attn auto`` (installed = usable: it starts no CUDA) and the
    runner's pick (it asks each backend) come from one choice, config.auto_attention: for every
    set of installed backends and of those usable on the GPU, the runner picks and falls back to
    names the launcher checked, or to torch where none installed is usable; where every installed
    one is usable, the runner picks the first the launcher lists of each role."""
    import itertools

    from minisgl_core.config import AUTO_DECODE, AUTO_PREFILL
    from minisgl_core.config_args import auto_attention_names
    from minisgl_core.runner.model_runner import decode_fallbacks

    class Backend:
        def __init__(self, usable: bool) -> None:
            self.usable, self.capabilities = usable, frozenset({"prefill", "decode"})

        def availability(self, device):
            return None if self.usable else "not here"

    class FakePlugins:
        def __init__(self, backends: dict[str, bool]) -> None:
            self.registry = {"attention": {name: Backend(ok) for name, ok in backends.items()}}

        def resolve(self, kind: str, name: str):
            return self.registry[kind][name]

    gpu = torch.device("cuda")
    gpu_backends = sorted(set(AUTO_PREFILL + AUTO_DECODE))
    for installed in itertools.chain.from_iterable(
        itertools.combinations(gpu_backends, k) for k in range(len(gpu_backends) + 1)
    ):
        for usable in itertools.product((True, False), repeat=len(installed)):
            plugins = FakePlugins({"torch": True} | dict(zip(installed, usable)))
            launcher = auto_attention_names("cuda", plugins)  # type: ignore[arg-type]
            assert auto_attention_names("cpu", plugins) == ("torch",)  # type: ignore[arg-type]
            prefill, decode = pick_attention("auto", gpu, plugins)  # type: ignore[arg-type]
            fallbacks = decode_fallbacks("auto", decode, gpu, plugins)  # type: ignore[arg-type]
            assert pick_attention("auto", torch.device("cpu"), plugins) == ("torch", "torch")  # type: ignore[arg-type]
            case = (installed, usable, launcher, prefill, decode)
            for name in (prefill, decode, *fallbacks):
                assert name in launcher or name == "torch", case
            if all(usable):
                # (the launcher lists each role's installed names in the role's order, else torch)
                first = [
                    next((n for n in role if n in launcher), "torch") for role in (AUTO_PREFILL, AUTO_DECODE)
                ]
                assert [prefill, decode] == first, case
                assert set(launcher) == {prefill, decode, *fallbacks}, case


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--num-kv-tokens", str(10**15)],
         "--num-kv-tokens=1000000000000000 (the KV pool) asks for 512000000000000512 bytes (454.7 PiB), more than "),
        (["--max-running-requests", str(10**12)], " free on cpu: lower --max-running-requests or --max-context-len"),
    ],
)  # fmt: skip
def test_a_kv_pool_past_the_memory_is_one_error_line_on_the_command_line(model_dir, args, says):
    """Exit code 2 and the flag, the bytes and what is free in the last line, no traceback (a raw
    allocator error once). Refused before the weights load, with what is free then."""
    proc = _cli("generate", "hi", *args, "--model", str(model_dir), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
    last = proc.stderr.splitlines()[-1]  # after the loading bar's lines
    assert "minisgl: error: " in last and says in last, last


def test_a_server_that_fails_after_start_says_why_at_any_log_level(model_dir):
    """Under --log-level critical a worker's failure was logged at ERROR only: serve exited 1 with
    nothing said. A setting a worker refuses is the command line's error line, shown at any level."""
    proc = _cli(
        "serve", "--port", "0", "--model", str(model_dir), "--device", "cpu", "--log-level", "critical",
        "--num-kv-tokens", str(10**15),
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("minisgl: error: --num-kv-tokens="), proc.stderr
    assert proc.stderr.rstrip().endswith(" free on cpu: lower --num-kv-tokens"), proc.stderr


def test_a_kv_pool_past_the_memory_is_said_once_by_serve_before_the_weights_load(model_dir):
    """The scheduler process logged its refusal and the launcher said it again (twice in the
    log), once the weights had loaded; then the launcher said it once, logged under "the
    scheduler 0 process failed:" with exit code 1. It is a usage error only the scheduler can
    judge (the memory free, the model's KV layout): now the command line's one error line and
    exit code 2, as for the settings it refuses itself, and no weight is read (the loading bar
    never shows)."""
    for flag, value in [("--num-kv-tokens", 10**15), ("--max-running-requests", 10**12)]:
        proc = _cli("serve", "--port", "0", "--model", str(model_dir), "--device", "cpu", flag, str(value))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        errors = [line for line in proc.stderr.splitlines() if f"{flag}={value} (" in line]
        assert len(errors) == 1 and errors[0].startswith(f"minisgl: error: {flag}={value} ("), proc.stderr
        assert proc.stderr.splitlines()[-1] == errors[0], proc.stderr
        assert "process failed" not in proc.stderr and "loading " not in proc.stderr, proc.stderr


def test_a_kv_pool_or_request_tables_past_the_device_name_the_setting_and_the_bytes(model_dir, monkeypatch):
    """An absurd num_kv_tokens or max_running_requests is refused before allocating (a raw
    allocator error once), and before the weights load (it was after: minutes for a large
    model); one that fits starts as before."""
    from minisgl_core.checkpoint.formats import SafetensorsFormat
    from minisgl_core.runner import model_runner

    pool_bytes = (10**15 + 1) * 512  # 2 layers x K,V x 2 heads x 16 dims x 4 bytes; one spare page
    table_bytes = (10**12 + 1) * (2048 * 4 + 16)  # a spare row; int32 per position, two int64
    absurd = [
        (dict(num_kv_tokens=10**15), f"num_kv_tokens=1000000000000000 (the KV pool) asks for {pool_bytes} bytes",
         ("num_kv_tokens",)),
        # (a context length not given is the model's: said so, a probe's find; it named only the setting)
        (dict(max_running_requests=10**12), f"max_running_requests=1000000000000 (request rows of "
         f"max_context_len=2048 tokens, the model's max_position_embeddings) asks for {table_bytes} bytes",
         ("max_running_requests", "max_context_len")),
        (dict(max_running_requests=10**12, max_context_len=2048), f"max_running_requests=1000000000000 "
         f"(request rows of max_context_len=2048 tokens) asks for {table_bytes} bytes",
         ("max_running_requests", "max_context_len")),
    ]  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(SafetensorsFormat, "weights", lambda *args: pytest.fail("the weights were read"))
        for options, says, fields in absurd:
            with pytest.raises(ConfigError) as err:
                LLM(model_dir, attn="torch", device="cpu", **options)
            assert str(err.value).startswith(says) and "free on cpu: lower " in str(err.value)
            assert err.value.fields == fields
    # where the free memory is not known, the failed allocation is the same error
    monkeypatch.setattr(model_runner, "free_bytes", lambda device: None)
    for options, says, fields in absurd:
        with pytest.raises(ConfigError) as err:
            LLM(model_dir, attn="torch", device="cpu", **options)
        message = str(err.value)
        assert message.startswith(f"{says} (") and ", and allocating it on cpu failed (" in message
        assert err.value.fields == fields and isinstance(err.value.__cause__, RuntimeError)
    monkeypatch.undo()
    llm = LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=2**19, max_running_requests=4096)
    assert llm.engine.kv_capacity_tokens == 2**19 and llm.engine.runner.page_table.shape == (4097, 2048)
    assert len(llm.generate(["hi"], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2


def test_settings_that_fit_alone_but_not_together_are_named_together():
    pool = MemoryAsk("num_kv_tokens=10 (the KV pool)", 600, ("num_kv_tokens",))
    tables = MemoryAsk(
        "max_running_requests=4 (request rows)", 500, ("max_running_requests", "max_context_len")
    )
    check_fits([pool, tables], torch.device("cpu"), 1100)
    check_fits([pool, tables], torch.device("cpu"), None)  # unknown: left to the allocation
    with pytest.raises(ConfigError) as err:
        check_fits([pool, tables], torch.device("cpu"), 1099)
    assert str(err.value) == (
        "num_kv_tokens=10 (the KV pool) asks for 600 bytes and max_running_requests=4 (request rows) asks "
        "for 500 bytes, more than the 1099 bytes (1.1 KiB) free on cpu: lower num_kv_tokens, "
        "max_running_requests or max_context_len"
    )
    assert cli_message(err.value).endswith(
        "lower --num-kv-tokens, --max-running-requests or --max-context-len"
    )


def test_a_chat_template_that_does_not_compile_is_refused_at_start_up(model_dir, tmp_path):
    """A Jinja syntax error started the server, then made every chat request a 400."""
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }\n{% endfor")
    proc = _cli(
        "serve", "--port", "0", "--model", str(model_dir), "--device", "cpu", "--chat-template", str(bad)
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"minisgl: error: --chat-template: {bad}, line 1: unexpected '}}'"]


def test_an_empty_chat_template_is_refused_at_start_up(model_dir, tmp_path):
    """An empty file started the server, then every chat turn said the tokenizer has no
    chat_template, naming neither the flag nor the file."""
    empty = tmp_path / "empty.jinja"
    empty.write_text("\n")
    proc = _cli(
        "serve", "--port", "0", "--model", str(model_dir), "--device", "cpu", "--chat-template", str(empty)
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: --chat-template: {empty} is empty; give a Jinja chat template file"
    ]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_unknown_log_level_is_one_line(how):
    """It was a traceback (logging's ValueError), from the flag or MINISGL_LOG_LEVEL."""
    args = ["--log-level", "bogus", "plugins"] if how == "flag" else ["plugins"]
    env = {**os.environ, "MINISGL_LOG_LEVEL": "bogus"} if how == "env" else None
    proc = run_cli(args, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    # (the variable's value was reported as the flag's, where no --log-level was given)
    source = "" if how == "flag" else "its default from MINISGL_LOG_LEVEL "
    assert proc.stderr.splitlines()[-1] == (
        f"minisgl: error: argument --log-level: {source}must be one of debug, info, warning, error, "
        "critical, got 'bogus'"
    )


@pytest.mark.parametrize(
    "command",
    [["plugins"], ["generate", "hi"], ["serve"], ["shell"], ["bench", "offline"], ["bench", "serve"],
     ["bench", "grammar"], ["bench", "cpu"], ["bench", "make-model", "--shape", "qwen3-0.6b", "--out", "x"]],
)  # fmt: skip
def test_log_level_is_taken_after_the_subcommand_too(command, monkeypatch):
    """``minisgl serve --log-level debug`` was 'unrecognized arguments': only ``minisgl --log-level
    debug serve`` was. After the subcommand it wins; without it, the one before (or the
    environment's) stands."""
    from minisgl_core.cli import build_parser

    monkeypatch.delenv("MINISGL_LOG_LEVEL", raising=False)
    parser = build_parser()
    assert parser.parse_args([*command, "--log-level", "DEBUG"]).log_level == "debug"
    assert parser.parse_args(["--log-level", "error", *command]).log_level == "error"
    assert parser.parse_args(["--log-level", "error", *command, "--log-level", "debug"]).log_level == "debug"
    assert parser.parse_args(command).log_level == "info"
    monkeypatch.setenv("MINISGL_LOG_LEVEL", "warning")
    assert build_parser().parse_args(command).log_level == "warning"


def test_a_closed_stdout_ends_quietly_and_a_full_disk_is_one_line():
    """``minisgl plugins --json | head -1`` and ``minisgl plugins > /dev/full`` were tracebacks
    (BrokenPipeError; OSError ENOSPC). A pipe without its reader is given as stdout here, so that
    the write fails whatever the timing; the exit status is CPython's recipe's."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "minisgl_core", "plugins", "--json"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (1, "")
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "minisgl_core", "plugins"], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "minisgl: error: cannot write: No space left on device; free some space or write elsewhere"
    ]


def test_log_level_after_the_subcommand_sets_the_level(model_dir):
    proc = _cli("generate", "hi", "--max-tokens", "1", "--log-level", "debug", "--model", str(model_dir),
                "--device", "cpu")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert " DEBUG " in proc.stderr
    proc = _cli("serve", "--log-level", "debug", "--page-size", "3", "--model", str(model_dir))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ["minisgl: error: --page-size must be a power of two >= 1, got 3"]


def test_serve_on_a_port_in_use_or_out_of_range_is_one_line_before_anything_loads(model_dir):
    # both once failed after the model loaded and the workers started: a port out of range in a
    # traceback, a port in use as "could not start (see the log above)" with nothing above
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = _cli("serve", "--port", str(port), "--model", str(model_dir), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: cannot listen on 127.0.0.1:{port}: Address already in use; pick another "
        "--port, or a --host of this machine (or stop what holds the port)"
    ]
    proc = _cli("serve", "--port", "99999", "--model", str(model_dir))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "argument --port: must be a TCP port, 0 to 65535 (0 = any free port), got 99999" in proc.stderr


def test_serve_with_a_dist_init_addr_in_use_is_one_line_before_anything_loads(model_dir):
    """It was scheduler 0's traceback (an OSError, then the RuntimeError it caused) once the
    workers had started, exit code 1 (a probe's find)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = _cli("serve", "--port", "0", "--tp", "2", "--dist-init-addr", f"127.0.0.1:{port}",
                    "--model", str(model_dir), "--device", "cpu")  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: cannot listen on --dist-init-addr 127.0.0.1:{port} for the TP rendezvous: "
        "Address already in use; give an address of this machine with a free port"
    ]
    # a host that is not text (bytes that are no UTF-8 on the command line) was a TypeError traceback
    proc = _cli("serve", "--port", "0", "--tp", "2", "--dist-init-addr", "\udced\udca0\udc80:5", "--model",
                str(model_dir), "--device", "cpu")  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(
        "minisgl: error: cannot listen on --dist-init-addr \\udced\\udca0\\udc80:5 for"
    ), proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["offline", "--grammar-schema", "/no/such.json"], "argument --grammar-schema: cannot read /no/such.json"),
        (["offline", "--temperature", "nan"], "argument --temperature: must be a finite number >= 0, got nan"),
        (["grammar", "--grammar-schema", "/no/such.json"], "argument --grammar-schema: cannot read /no/such.json"),
        # (1 was a traceback from the grammar backend: no token could begin any text)
        *[(["grammar", "--vocab-size", size], "argument --vocab-size: must be an integer >= 4096 (the tokens of "
           f"the tokenizer the bench trains), got {size}") for size in ("1", "4095", "0", "-3")],
        (["cpu", "--batch-sizes", "8,a"], "argument --batch-sizes: must be integers >= 1 separated by commas"),
        (["make-model", "--shape", "qwen3-0.6b", "--out", "/proc/no/such"], "cannot write /proc/no/such"),
    ],
)  # fmt: skip
def test_bench_inputs_it_cannot_use_are_one_line_before_anything_loads(args, says):
    # each was a traceback (the schema file, the temperature after the model loaded)
    proc = _cli("bench", *args)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert says in proc.stderr.strip().splitlines()[-1], proc.stderr


#: JSON that is no schema the default grammar backend (xgrammar) compiles, and a word of its refusal
REFUSED_SCHEMAS = [('{"type": "foo"}', "foo"), ("5", "5"), ('{"not": {}}', "not"),
                   ('{"type": "array", "uniqueItems": true}', "uniqueItems")]  # fmt: skip


@pytest.mark.parametrize(("schema", "word"), REFUSED_SCHEMAS)
def test_bench_grammar_with_a_schema_the_backend_refuses_is_one_line(
    tmp_path_factory, tmp_path, schema, word
):
    # (the grammar backend's GrammarError traceback, exit code 1)
    source = tmp_path / "schema.json"
    source.write_text(schema)
    cache = tmp_path_factory.getbasetemp() / "bench-tokenizer"  # (trained once for the four)
    proc = _cli("bench", "grammar", "--grammar-schema", str(source), "--vocab-size", "4096", "--rows", "2",
                "--steps", "3", "--warm-steps", "1", "--max-tokens", "8", "--model-cache", str(cache))  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"minisgl bench grammar: error: argument --grammar-schema: {source}: "), line
    assert word in line.split(str(source), 1)[1], line
    assert proc.stdout == ""


def test_bench_offline_with_a_schema_the_backend_refuses_is_one_line(tmp_path):
    # (the same traceback once the model had loaded; a vocabulary the standard workload fits).
    # Refused from the tokenizer before the weights load: a NaN in them would be said first.
    from safetensors.torch import load_file, save_file

    model = make_model_dir(tmp_path / "m", "LlamaForCausalLM", vocab_size=10240)
    tensors = load_file(str(model / "model.safetensors"))
    tensors["model.norm.weight"][0] = float("nan")
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    source = tmp_path / "schema.json"
    source.write_text('{"type": "foo"}')
    proc = _cli("bench", "offline", "--model", str(model), "--device", "cpu", "--num-requests", "1",
                "--grammar-schema", str(source))  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"minisgl bench offline: error: argument --grammar-schema: {source}: "), last
    assert "foo" in last.split(str(source), 1)[1] and proc.stdout == "", last


def test_bench_grammar_runs_at_its_smallest_vocabulary(tmp_path):
    proc = _cli("bench", "grammar", "--vocab-size", "4096", "--rows", "2", "--steps", "4", "--warm-steps", "2",
                "--max-tokens", "16", "--model-cache", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["vocab_size"] == 4096


def test_generate_past_the_context_is_an_error_naming_the_flag(model_dir):
    # once a ValueError traceback, after the model had loaded
    proc = _cli("generate", "hi", "--max-tokens", "100000000", "--model", str(model_dir), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("minisgl: error: prompt (") and "exceeds the context length" in last, last
    assert last.endswith("shorten the prompt or lower --max-tokens"), last


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["offline", "--num-requests", "1", "--max-context-len", "64"],
         "bench offline's requests take up to 1688 tokens (prompt and output), more than --max-context-len 64; "
         "raise it to 1688"),
        (["offline", "--num-requests", "1", "--num-kv-tokens", "64"],
         "bench offline's requests take up to 1688 tokens (prompt and output), more than the KV pool's 64; raise "
         "--num-kv-tokens to 1688"),
        (["cpu", "--no-transformers", "--batch-sizes", "1", "--max-new-tokens", "5000", "--rounds", "1"],
         "bench cpu's requests take up to 5027 tokens (prompt and output), more than the model's context length "
         "2048; lower --max-new-tokens"),
        (["cpu", "--no-transformers", "--batch-sizes", "1", "--max-new-tokens", "100", "--num-kv-tokens", "64"],
         "bench cpu's requests take up to 127 tokens (prompt and output), more than the KV pool's 64; raise "
         "--num-kv-tokens to 127 or lower --max-new-tokens"),
    ],
)  # fmt: skip
def test_a_bench_workload_past_the_engines_limits_is_one_line_naming_the_flag(model_dir, args, says):
    """A ContextLengthExceeded traceback from the first generate (bench offline's warm-up), once
    the model had loaded; bench offline's flags are checked before it loads."""
    proc = _cli("bench", *args, "--model", str(model_dir), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"minisgl: error: {says}", proc.stderr[-2000:]
    if args[0] == "offline":
        assert "loading" not in proc.stderr, proc.stderr  # (before the model)


@pytest.mark.parametrize("tp", ["1", "2"])
def test_bench_offline_on_a_model_too_small_for_its_token_ids_says_so(model_dir, tp):
    """The standard workload draws prompt ids up to 10,000: a smaller vocabulary is one message
    naming the fix, not a traceback from the first request (with --tp 2: every rank's traceback
    and the runner's RuntimeError)."""
    proc = _cli(
        "bench", "offline", "--num-requests", "1", "--model", str(model_dir), "--device", "cpu", "--tp", tp
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "has a vocabulary of" in proc.stderr and "--shape qwen3-0.6b" in proc.stderr, proc.stderr[-2000:]
    # (from config.json, before the weights: with --tp 1 it was said once they had loaded)
    assert "loading" not in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory):
    """A vocabulary the standard workload's ids fit in, and a context its requests do not."""
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "short",
        "LlamaForCausalLM",
        vocab_size=10240,
        max_position_embeddings=256,
    )


@pytest.mark.parametrize("tp", ["1", "2"])
def test_bench_offline_past_the_models_context_is_one_line(short_model_dir, tp):
    """With --tp 2 each rank's warm-up raised ContextLengthExceeded as a traceback; --tp 1 said it
    in one line, once the model had loaded."""
    proc = _cli("bench", "offline", "--num-requests", "1", "--model", str(short_model_dir), "--device", "cpu",
                "--tp", tp)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "minisgl: error: bench offline's requests take up to 1688 tokens (prompt and output), more than the "
        "model's context length 256; use a model with a longer one"
    ), proc.stderr[-2000:]


def test_attn_auto_is_torch_on_cpu_and_pairs_parse():
    plugins = Plugins.load()
    cpu = torch.device("cpu")
    assert pick_attention("auto", cpu, plugins) == ("torch", "torch")
    assert pick_attention("fa3,fi", cpu, plugins) == ("fa3", "fi")
    assert pick_attention("fi", cpu, plugins) == ("fi", "fi")
    with pytest.raises(ValueError, match="--attn"):
        pick_attention("a,b,c", cpu, plugins)


def test_attn_auto_says_why_it_falls_back_to_torch_on_a_gpu(caplog):
    """Where no GPU backend is usable, ``auto`` still runs (on torch) but warns, naming why each
    candidate was passed over: a benchmark on a GPU once ran torch prefill unnoticed (16.5k tok/s
    against 26k), its result only saying ``"attn": "torch,triton"``."""
    import logging

    plugins = Plugins.load()
    gpu = torch.device("cuda")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, where no GPU backend is usable")
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        assert pick_attention("auto", gpu, plugins) == ("torch", "torch")
    text = caplog.text
    assert "no GPU prefill backend" in text and "no GPU decode backend" in text, text
    for name in ("fa3", "fi", "triton"):
        assert f"{name}: " in text, text
    assert "torch.cuda.is_available() is False" in text or "not installed" in text, text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        pick_attention("auto", torch.device("cpu"), plugins)  # torch is the CPU's choice: no warning
    assert caplog.text == ""


def test_attn_auto_on_a_gpu_takes_the_first_usable_of_each_list():
    """On CUDA ``auto`` is fa3 prefill + triton decode where both are usable, and steps down the
    lists (AUTO_PREFILL, AUTO_DECODE) where one is missing or unavailable; a decode backend that
    refuses the model is followed by the next usable one, under ``auto`` only."""
    from minisgl_core.runner.model_runner import decode_fallbacks

    class Backend:
        def __init__(self, usable: bool, capabilities: frozenset = frozenset({"kv_fp8"})) -> None:
            self.usable = usable
            self.capabilities = capabilities

        def availability(self, device):
            return None if self.usable else "not here"

    class FakePlugins:
        def __init__(self, **backends: bool) -> None:
            self.registry = {"attention": {name: Backend(ok) for name, ok in backends.items()}}

        def resolve(self, kind: str, name: str):
            return self.registry[kind][name]

    gpu = torch.device("cuda")
    every = FakePlugins(torch=True, fi=True, fa3=True, triton=True)
    assert pick_attention("auto", gpu, every) == ("fa3", "triton")  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, FakePlugins(torch=True, fi=True, fa3=False, triton=True)) == (
        "fi",
        "triton",
    )  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, FakePlugins(torch=True, fi=True, fa3=True)) == ("fa3", "fi")  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, FakePlugins(torch=True, fi=True, triton=False)) == ("fi", "fi")  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, FakePlugins(torch=True)) == ("torch", "torch")  # type: ignore[arg-type]
    assert decode_fallbacks("auto", "triton", gpu, every) == ["fi"]  # type: ignore[arg-type]
    assert decode_fallbacks("auto", "fi", gpu, every) == []  # type: ignore[arg-type]
    assert decode_fallbacks("fa3,triton", "triton", gpu, every) == []  # type: ignore[arg-type]
    # a float8 pool: auto skips backends that do not declare "kv_fp8" (fa3 does not)
    every.registry["attention"]["fa3"].capabilities = frozenset()
    fp8 = frozenset({"kv_fp8"})
    assert pick_attention("auto", gpu, every, fp8) == ("fi", "triton")  # type: ignore[arg-type]
    assert pick_attention("auto", gpu, every) == ("fa3", "triton")  # type: ignore[arg-type]


def test_attn_auto_lists_name_real_backends():
    from minisgl_core.runner.model_runner import AUTO_DECODE, AUTO_PREFILL

    plugins = Plugins.load()
    for name in AUTO_PREFILL + AUTO_DECODE:
        assert name in plugins.registry["attention"], name
    for name in AUTO_PREFILL:
        assert "prefill" in plugins.resolve("attention", name).capabilities, name
    for name in AUTO_DECODE:
        assert "decode" in plugins.resolve("attention", name).capabilities, name


def test_a_backend_is_used_only_for_the_steps_it_declares():
    from minisgl_core.api import AttentionBackend
    from minisgl_core.runner.model_runner import check_roles

    class DecodeOnly(AttentionBackend):
        capabilities = frozenset({"decode"})

    class PrefillOnly(AttentionBackend):
        capabilities = frozenset({"prefill"})

    plugins, cpu = Plugins.load(), torch.device("cpu")
    backends = {"dec": DecodeOnly, "pre": PrefillOnly, "torch": plugins.resolve("attention", "torch")}
    check_roles("torch", "dec", backends, plugins, cpu)
    check_roles("pre", "torch", backends, plugins, cpu)
    # the partner suggested is one that runs here: torch on a CPU (it said fi on every device)
    with pytest.raises(PluginError, match="'dec' does not run prefill steps.*--attn torch,dec$"):
        check_roles("dec", "dec", backends, plugins, cpu)
    with pytest.raises(PluginError, match="'pre' does not run decode steps.*--attn pre,torch$"):
        check_roles("pre", "pre", backends, plugins, cpu)
    # none installed runs the missing role here: said so, no backend named
    plugins.registry["attention"] = {}
    with pytest.raises(PluginError) as raised:
        check_roles("pre", "pre", backends, plugins, cpu)
    assert str(raised.value).endswith(
        "use it for prefill only, beside a backend that runs decode steps (none installed runs them on cpu)"
    )


PREFILL_ONLY = """
from minisgl_core.api import hookimpl
from minisgl_plugin_torch.backend import TorchAttentionBackend

MINISGL_API = "2.0"


class PrefillOnly(TorchAttentionBackend):
    capabilities = frozenset({"prefill"})


@hookimpl
def minisgl_register_attention_backends(register):
    register("pre-only", "minisgl_preonly:PrefillOnly")
"""


def test_a_prefill_only_backend_alone_is_refused_suggesting_a_partner_that_runs_here(
    model_dir, install_plugin_module
):
    """A probe's find: on a CPU the hint was ``--attn pre-only,fi``, a backend that cannot run there."""
    install_plugin_module("minisgl_preonly", "minisgl-preonly", PREFILL_ONLY)
    with pytest.raises(PluginError) as raised:
        LLM(model_dir, device="cpu", attn="pre-only")
    assert str(raised.value) == (
        "attention backend 'pre-only' does not run decode steps (it does not declare 'decode'); use it "
        "for prefill only, e.g. attn='pre-only,torch'"
    )


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        (
            {"attn": "triton"},
            "attention backend 'triton' does not run prefill steps (it does not declare 'prefill'); use it "
            "for decode only, e.g. attn='torch,triton'",
        ),
        (  # (the partner suggested runs here: triton, under the interpreter)
            {"attn": "pre-only"},
            "attention backend 'pre-only' does not run decode steps (it does not declare 'decode'); use it "
            "for prefill only, e.g. attn='pre-only,triton'",
        ),
        (
            {"attn": "pre-only,torch", "page_size": 4},
            "attention backend 'pre-only' supports only page_size=1 (it does not declare \"page_size>1\")",
        ),
    ],
)
def test_an_attention_backend_that_cannot_run_here_is_refused_before_the_engine_starts(
    model_dir, install_plugin_module, monkeypatch, settings, refusal
):
    """``LLM(attn="triton")`` where Triton runs (TRITON_INTERPRET=1 on a CPU; a GPU): triton runs
    decode steps only, and was refused from inside the engine once its start had begun (the
    plugins' process-start hooks run, a RuntimeError), where ``LLM(attn="fi")`` on a CPU is a
    ValueError before anything starts. Now the same: a ValueError naming the fix, no engine built."""
    import minisgl_core.llm

    install_plugin_module("minisgl_preonly", "minisgl-preonly", PREFILL_ONLY)
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine was started before the refusal")

    monkeypatch.setattr(minisgl_core.llm, "Engine", no_engine)
    with pytest.raises(ValueError) as refused:
        LLM(model_dir, device="cpu", **settings)
    assert str(refused.value) == refusal


def test_a_backend_refusing_the_model_is_one_clear_error():
    from minisgl_core.api import AttentionBackend
    from minisgl_core.runner.model_runner import build_backend

    class Picky(AttentionBackend):
        def __init__(self, config):
            raise ValueError("head_dim 24 is not a power of two")

        prepare_metadata = forward = None  # type: ignore[assignment]

    with pytest.raises(PluginError, match="'picky' cannot run this model: head_dim 24 is not a power of two"):
        build_backend("picky", Picky, None)  # type: ignore[arg-type]


def test_gpu_backend_on_cpu_says_why(model_dir, monkeypatch):
    """A ValueError naming attn and the fix, before the engine starts, as serve refuses it (a
    PluginError, a RuntimeError, from the model runner once)."""
    import minisgl_core.llm

    monkeypatch.setattr(minisgl_core.llm, "Engine", lambda *args: pytest.fail("the engine started"))
    for attn in ("fi", "torch,fi"):
        with pytest.raises(
            ValueError, match="^attn='fi' cannot run on cpu: .*CUDA.*; use attn='auto' to pick one that does$"
        ):
            LLM(model_dir, attn=attn, device="cpu")


def test_the_python_api_names_its_keyword_arguments_not_the_flags(model_dir, tmp_path):
    """LLM(...)'s errors said --model, --attn: flags a Python caller never typed (the command line
    keeps them); LLM("") spoke of a model '.' no one had named."""
    with pytest.raises(ModelPathError) as err:
        LLM("")
    assert str(err.value).startswith("the model path (model=) is empty; give a model directory, ")
    assert str(err.value).endswith("or leave model= out for the default model")
    nowhere = str(tmp_path / "nowhere")
    with pytest.raises(ModelPathError) as err:
        LLM(nowhere, attn="torch", device="cpu")
    assert str(err.value).startswith(f"model={nowhere!r}: no such file or directory")
    with pytest.raises(PluginError) as err:
        LLM(model_dir, attn="nope", device="cpu")
    assert str(err.value).startswith("unknown attn='nope'; installed: ")
    with pytest.raises(PluginError) as err:  # the command line's loader: its flags
        Plugins.load().resolve("attention", "nope")
    assert str(err.value).startswith("unknown --attn 'nope'; installed: ")


def test_llm_refuses_what_it_would_ignore_and_names_its_keywords(model_dir, tmp_path):
    """Found by a probe: LLM(speculative_num_draft_tokens=3) ran without speculation (the command
    line refuses it), generation_config= named its flag, and an unknown keyword was EngineConfig's
    TypeError with no hint."""
    from minisgl_core.config import ConfigError

    for name in ("speculative_num_draft_tokens", "speculative_ngram_max", "speculative_ngram_min"):
        with pytest.raises(ConfigError, match=rf"^{name} needs speculative_algorithm='ngram'"):
            LLM(model_dir, device="cpu", **{name: 2})
    with pytest.raises(ValueError) as err:
        LLM(model_dir, device="cpu", generation_config=str(tmp_path))
    assert str(err.value).startswith(f"generation_config={str(tmp_path)!r}: no generation_config.json there")
    with pytest.raises(TypeError, match=r"'max_running_request'; did you mean max_running_requests=\?"):
        LLM(model_dir, device="cpu", max_running_request=4)
    with pytest.raises(
        TypeError, match=r"'disable_fast_path'; did you mean fast_paths=.*FastPaths\(\)\.without"
    ):
        LLM(model_dir, device="cpu", disable_fast_path=["compile"])


def test_vllms_keywords_point_at_minisgls_and_a_model_that_is_no_path_is_a_type_error(model_dir):
    """Found by a tester: LLM(tensor_parallel_size=2) and LLM(trust_remote_code=True) had no hint
    (gpu_memory_utilization and max_model_len had one), and LLM(model=123) was "model='123': no
    such file or directory"."""
    for name, hint in [
        ("tensor_parallel_size", "tp_size="),
        ("max_num_seqs", "max_running_requests="),
        ("max_num_batched_tokens", "max_prefill_tokens="),
        ("enforce_eager", "cuda_graph_max_bs=0"),
        ("enable_prefix_caching", "cache='radix'"),
        ("gpu_memory_utilization", "kv_memory_fraction="),
        ("max_model_len", "max_context_len="),
        ("scheduling_policy", "policy= (policy='priority' for vLLM's 'priority'"),
    ]:
        with pytest.raises(
            TypeError, match=rf"^LLM\(\) got an unexpected keyword argument '{name}'; did you mean "
        ) as err:
            LLM(model_dir, device="cpu", **{name: 1})
        assert f"did you mean {hint}" in str(err.value)
    with pytest.raises(
        TypeError, match=r"'trust_remote_code': minisgl runs no model code from a hub .*leave it out$"
    ):
        LLM(model_dir, device="cpu", trust_remote_code=True)
    for model in (123, ["m"]):
        with pytest.raises(
            TypeError, match=rf"^model must be a path \(str or os.PathLike\).*, got {type(model).__name__}$"
        ):
            LLM(model, device="cpu")


def test_a_max_context_len_past_the_model_is_capped_naming_what_the_user_set(model_dir, caplog):
    """The cap's warning said --max-context-len to LLM(max_context_len=...) callers too: it names
    the keyword for the Python API and the flag for the command line (``generate``: from_config
    with spelling="flag")."""
    import logging

    from minisgl_core.checkpoint.resolve import resolve_model

    max_pos = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    asked = max_pos * 4
    says = f"is more than the model's max_position_embeddings {max_pos}: using {max_pos}"
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        with LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=256, max_context_len=asked) as llm:
            assert llm.engine.max_context_len == max_pos
    assert f"max_context_len={asked} {says}" in caplog.text, caplog.text
    assert "--max-context-len" not in caplog.text, caplog.text
    caplog.clear()
    config = EngineConfig(
        model=resolve_model(str(model_dir)),
        attn="torch",
        device="cpu",
        num_kv_tokens=256,
        max_context_len=asked,
    )
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        LLM.from_config(config, spelling="flag").close()
    assert f"--max-context-len {asked} {says}" in caplog.text, caplog.text


def test_cuda_graph_settings_on_a_cpu_are_named_as_unused(model_dir, caplog):
    """On a CPU the CUDA-graph sizes cannot act: a value of the user's own is accepted (one command
    line serves either machine) but warned about, spelt as given; the defaults and 0 (off) are not."""
    import logging

    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        with LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=256, cuda_graph_max_bs=64):
            pass
    assert "cuda_graph_max_bs=64 has no effect on cpu: CUDA graphs run on CUDA GPUs only" in caplog.text
    assert "piecewise" not in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        with LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=256, cuda_graph_max_bs=0):
            pass
    assert "no effect" not in caplog.text, caplog.text
    config = EngineConfig(
        model=str(model_dir),
        attn="torch",
        device="cpu",
        num_kv_tokens=256,
        piecewise_cuda_graph_max_tokens=512,
    )
    with caplog.at_level(logging.WARNING, logger="minisgl_core.runner.model_runner"):
        LLM.from_config(config, spelling="flag").close()
    assert "--piecewise-cuda-graph-max-tokens 512 has no effect on cpu" in caplog.text, caplog.text


def test_nnodes_below_one_is_named():
    from minisgl_core.distributed import DistributedSpec

    with pytest.raises(ValueError, match=r"^--nnodes must be >= 1, got 0$"):
        DistributedSpec(nnodes=0)


def test_page_size_defaults_by_device_and_backend_capabilities():
    from minisgl_core.api import AttentionBackend
    from minisgl_core.runner.model_runner import resolve_page_size

    class Paged(AttentionBackend):
        capabilities = frozenset({"prefill", "decode", "page_size>1"})

    class SingleToken(AttentionBackend):
        capabilities = frozenset({"prefill", "decode"})

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_page_size(None, cuda, {"a": Paged, "b": Paged}) == 16
    assert resolve_page_size(None, cpu, {"a": Paged}) == 1
    assert resolve_page_size(None, cuda, {"a": Paged, "b": SingleToken}) == 1  # the default stays valid
    assert resolve_page_size(4, cpu, {"a": Paged}) == 4
    with pytest.raises(PluginError, match="'b' supports only --page-size 1"):
        resolve_page_size(16, cuda, {"a": Paged, "b": SingleToken})
    # the Python API's spelling keeps the number a number (it said page_size='1')
    with pytest.raises(PluginError, match=r"'b' supports only page_size=1 \(it does not"):
        resolve_page_size(16, cuda, {"a": Paged, "b": SingleToken}, "keyword")


def test_the_engine_runs_at_the_page_size_it_resolved(model_dir):
    llm = LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=512)
    assert llm.config.page_size is None and llm.engine.config.page_size == 1
    assert llm.engine.kv_capacity_tokens == 512  # plus one page for the CUDA-graph padding
    llm = LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=512, page_size=8)
    assert llm.engine.runner.kv_cache.page_size == 8 and llm.engine.kv_capacity_tokens == 512
    assert llm.engine.scheduler.kv.cache.page_size == 8


def test_a_page_larger_than_the_context_or_the_kv_pool_is_refused_naming_page_size(model_dir):
    """--page-size had no upper bound: one past the context loaded and ran (no request ever fills
    such a page), one past the pool failed in the scheduler after start-up, blaming the pool size."""
    import argparse

    from minisgl_core.config_args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(
        ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--page-size", "4096"]
    )
    with pytest.raises(ConfigError) as err:  # at start, before any process (the tiny model's context: 2048)
        engine_config_from_args(args)
    assert cli_message(err.value) == (
        "--page-size 4096 is larger than the context length 2048, so no request ever fills a page; use a "
        "--page-size of at most 2048"
    )
    with pytest.raises(ConfigError) as err:  # the offline LLM: the runner's check, naming the keyword
        LLM(model_dir, attn="torch", device="cpu", page_size=2**20)
    assert str(err.value).startswith("page_size 1048576 is larger than the context length 2048")
    from minisgl_core.config import check_page_size

    with pytest.raises(ConfigError) as err:  # a long context on the CPU's default pool (65536 tokens)
        check_page_size(65536, 131072, 65536)
    assert cli_message(err.value) == (
        "--page-size 65536 leaves the KV pool (65536 tokens) fewer than the two pages it needs; use a "
        "--page-size of at most 32768, or a larger --num-kv-tokens"
    )
    check_page_size(2048, 2048, 4096)  # a page as long as the context, two in the pool: fine


def test_kv_memory_fraction_says_what_it_is_a_share_of_and_that_a_cpu_does_not_use_it(model_dir):
    """Its help said nothing, and on a CPU it changes nothing: the pool holds --num-kv-tokens
    tokens, by default the runner's CPU default, the number the help gives."""
    import argparse

    from minisgl_core.config_args import add_engine_args
    from minisgl_core.runner.model_runner import CPU_DEFAULT_KV_TOKENS

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    helps = {action.dest: action.help or "" for action in parser._actions}
    fraction = helps["kv_memory_fraction"]
    assert fraction.startswith("the share of the GPU memory free once the weights are loaded, less 4 GiB")
    assert (
        "on a CPU the pool holds --num-kv-tokens tokens (default: sized to the run and the free memory)"
        in fraction
    )
    assert (
        f"--max-context-len can use, at most {CPU_DEFAULT_KV_TOKENS} and half the free memory; on a GPU, "
        "sized by --kv-memory-fraction)" in helps["num_kv_tokens"]
    )
    llm = LLM(model_dir, attn="torch", device="cpu", kv_memory_fraction=0.01, max_running_requests=4)
    try:
        runner = llm.engine.runner
        # what 4 requests of max_context_len 2048 can use, within the default's 65,536 (tests/test_cpu_kv_pool.py)
        assert runner.usable_kv_pages * runner.page_size == min(CPU_DEFAULT_KV_TOKENS, 4 * 2048)
    finally:
        llm.close()


@pytest.mark.parametrize("command", [["serve"], ["bench", "offline"]])
def test_every_engine_flag_defaults_to_the_engine_config_default(command):
    """`minisgl serve` and `bench offline` with no engine flag build what ``EngineConfig(model=...)``
    holds: a default changed in the config is the command line's too (the piecewise graphs' 8,192
    was the config's while the flag still said 2,048)."""
    import argparse
    import dataclasses

    from minisgl_core.bench.cli import add_bench_command
    from minisgl_core.config_args import ENGINE_FIELDS, SPECULATIVE_TUNING, add_engine_args
    from minisgl_core.server.cli import add_server_commands

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    add_server_commands(sub)
    add_bench_command(sub)
    args = parser.parse_args(command)
    defaults = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert set(ENGINE_FIELDS) <= set(defaults)
    # (speculative decoding's tuning flags are None when not given: EngineConfig's default then, and
    # given without --speculative-algorithm they are an error)
    assert all(getattr(args, name) is None for name in SPECULATIVE_TUNING)
    fields = [name for name in ENGINE_FIELDS if name not in SPECULATIVE_TUNING]
    assert {name: getattr(args, name) for name in fields} == {name: defaults[name] for name in fields}
    assert args.piecewise_cuda_graph_max_tokens == 8192
    plain = argparse.ArgumentParser()
    add_engine_args(plain)
    assert plain.parse_args([]).piecewise_cuda_graph_max_tokens == defaults["piecewise_cuda_graph_max_tokens"]


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--n", "2", "hi"],  # argparse took it for --num-kv-tokens 2
        ["serve", "--max-running", "4"],
        ["bench", "serve", "--num", "5"],
    ],
)
def test_a_flag_not_spelled_out_is_refused_not_taken_for_another(argv, capsys):
    from minisgl_core.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    flag = next(a for a in argv if a.startswith("--"))
    assert exit_.value.code == 2 and f"unrecognized arguments: {flag}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--port", "99999"], "minisgl serve: error: argument --port: must be a TCP port"),
        (["generate", "--seed", "abc", "hi"], "minisgl generate: error: argument --seed: invalid int value: 'abc'"),
        (["bench", "offline", "--num-requests", "0"], "minisgl bench offline: error: argument --num-requests: "),
        (["serve", "--bogus"], "minisgl: error: unrecognized arguments: --bogus"),
        # (torch.set_num_threads' ValueError traceback, "Overflow when unpacking long")
        (["bench", "cpu", "--threads", str(2**31)], "minisgl bench cpu: error: argument --threads: must be 1 to "),
        # (taken as the working directory, and as the flag left out)
        (["bench", "grammar", "--model-cache", ""], "minisgl bench grammar: error: argument --model-cache: is empty"),
        (["bench", "serve", "--tokenizer", ""], "minisgl bench serve: error: argument --tokenizer: is empty"),
        # (without the usage block, the line named argparse's dest alone: "required: command")
        ([], "minisgl: error: the following arguments are required: command (one of: plugins, generate, serve, shell, bench)"),
        (["bench"], "minisgl bench: error: the following arguments are required: bench_kind (one of: offline, serve, "),
    ],
)  # fmt: skip
def test_a_value_argparse_refuses_is_one_line_without_the_usage_block(argv, says, capsys):
    """Found by a probe: argparse's refusals printed the usage block (14-38 lines) above the line
    saying what is wrong, where every other refusal of the command line is that line alone; a
    missing subcommand's line lists the subcommands, as the usage block did."""
    from minisgl_core.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(says), err


def test_a_file_no_format_reads_is_one_line(tmp_path):
    """A .gguf of junk: the message was right but came as a traceback (a plain ValueError); now
    the launcher's first look at the file names what is wrong with it."""
    junk = tmp_path / "x.gguf"
    junk.write_bytes(b"junk")
    proc = _cli("generate", "hi", "--model", str(junk), "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [
        f"minisgl: error: --model {junk} is not a GGUF file (it does not start with the GGUF magic)"
    ]


@pytest.mark.parametrize("addr", ["garbage", "127.0.0.1:99999", ":5000", "host:port"])
def test_a_bad_dist_init_addr_is_a_usage_error_before_anything_starts(model_dir, addr):
    """A traceback from scheduler rank 1 (not enough values to unpack, bind()'s OverflowError)
    once the model was loading."""
    proc = _cli("serve", "--port", "0", "--tp", "2", "--dist-init-addr", addr, "--model", str(model_dir))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        f"argument --dist-init-addr: must be HOST:PORT with a port in [1, 65535], got {addr!r}" in proc.stderr
    )


def test_bench_offline_refuses_a_plugin_name_before_building_its_model(tmp_path):
    """``bench offline --shape`` built the random-weight model (minutes of a CPU for Qwen3-0.6B)
    before a mistyped --attn or --cache was refused."""
    proc = _cli(
        "bench", "offline", "--shape", "qwen3-0.6b", "--model-cache", str(tmp_path), "--cache", "radixx"
    )
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith(
        "minisgl: error: unknown --cache 'radixx'"
    )
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


def test_bench_offline_resolves_the_plugin_names_once(model_dir, monkeypatch):
    """The early check (before --shape builds its model) is the only one: engine_config_from_args
    takes the names as checked."""
    import argparse

    from minisgl_core.bench import cli as bench_cli

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    resolved: list[tuple[str, str]] = []
    resolve = Plugins.resolve
    monkeypatch.setattr(
        Plugins,
        "resolve",
        lambda self, kind, name: resolved.append((kind, name)) or resolve(self, kind, name),
    )
    monkeypatch.setattr(bench_cli, "_make", lambda shape, out, device, overwrite=False: model_dir)
    monkeypatch.setattr(bench_cli, "_check_workload_size", stop)  # (the config is built: stop there)
    parser = argparse.ArgumentParser()
    bench_cli.add_bench_command(parser.add_subparsers())
    args = parser.parse_args(
        ["bench", "offline", "--shape", "qwen3-0.6b", "--num-requests", "1", "--device", "cpu"]
    )
    with pytest.raises(Stop):
        bench_cli._offline(args)
    assert resolved.count(("caches", args.cache)) == resolved.count(("policies", args.policy)) == 1

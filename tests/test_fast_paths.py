"""The fast-path switches: one frozen object, set from the command line or the documented
environment variables, applied by the model runner, read by the kernels and the all-reduce."""

from __future__ import annotations

import argparse

import pytest
import torch

from minisgl_core import fast_paths
from minisgl_core.config_args import add_engine_args, engine_config_from_args
from minisgl_core.fast_paths import FastPaths
from minisgl_core.layers import triton_ops

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def _unconfigured(monkeypatch):
    """Each test starts as a process that has not configured its switches."""
    monkeypatch.setattr(fast_paths, "_configured", None)
    for var in fast_paths.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)


def _config(*argv: str):
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(["--model", "demo", *argv]))


def test_all_on_by_default_and_each_variable_turns_one_off(monkeypatch):
    assert fast_paths.from_env({}) == FastPaths()
    for name, var in fast_paths.ENV_VARS.items():
        assert fast_paths.from_env({var: "0"}) == FastPaths().without(name)
        assert fast_paths.from_env({var: "1"}) == FastPaths()
    assert set(fast_paths.ENV_VARS) == set(fast_paths.NAMES)


def test_command_line_and_environment_both_reach_the_engine_config(monkeypatch):
    assert _config().fast_paths == FastPaths()
    config = _config("--disable-fast-path", "fused_kv", "--disable-fast-path", "symm_mem")
    assert config.fast_paths == FastPaths(fused_kv=False, symm_mem=False)
    monkeypatch.setenv("MINISGL_TRITON_SILU", "0")
    assert _config("--disable-fast-path", "compile").fast_paths == FastPaths(compile=False, triton_silu=False)


def test_unknown_name_is_a_cli_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        _config("--disable-fast-path", "warp_speed")
    assert exc.value.code == 2
    assert "fused_kv" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown fast path.*choose from compile"):
        FastPaths().without("warp_speed")


def test_compile_off_turns_every_triton_kernel_off():
    off = FastPaths(compile=False)
    assert not any(off.enabled(name) for name in ("compile", "fused_kv", "triton_silu", "triton_sampler"))
    assert off.enabled("symm_mem")


def test_kernels_follow_the_configured_switches_not_the_environment(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets the Triton kernels run on the CPU
    monkeypatch.setattr(triton_ops, "triton_available", lambda: True)
    cpu = torch.device("cpu")
    assert triton_ops.fused_kv_enabled(cpu) and triton_ops.silu_mul_enabled(cpu)
    monkeypatch.setenv("MINISGL_FUSED_KV", "0")  # unconfigured: the environment decides
    assert not triton_ops.fused_kv_enabled(cpu)
    fast_paths.configure(FastPaths(triton_silu=False))  # configured: the environment no longer does
    assert triton_ops.fused_kv_enabled(cpu) and not triton_ops.silu_mul_enabled(cpu)
    assert triton_ops.triton_enabled(cpu, "MINISGL_TRITON_SAMPLER")
    fast_paths.configure(FastPaths(compile=False))
    assert not triton_ops.triton_enabled(cpu, "MINISGL_TRITON_SAMPLER")


def test_the_model_runner_applies_its_config(tiny_model_dir):
    from minisgl_core.llm import LLM

    wanted = FastPaths(fused_kv=False, triton_sampler=False)
    llm = LLM(tiny_model_dir, attn="torch", device="cpu", dtype="float32", fast_paths=wanted)
    try:
        assert llm.engine.config.fast_paths == wanted
        assert fast_paths.current() == wanted
        assert not llm.engine.sampler.triton
    finally:
        llm.close()


def test_a_switch_or_a_setting_of_the_wrong_type_is_refused_naming_it(tiny_model_dir):
    """FastPaths(compile="no") was taken for true, and LLM(fast_paths={...}) failed in the first
    kernel that asked for a switch (an AttributeError)."""
    from minisgl_core.config import ConfigError
    from minisgl_core.llm import LLM

    for value in ("no", 0, None):
        with pytest.raises(TypeError) as err:
            FastPaths(compile=value)
        assert str(err.value) == f"FastPaths field compile must be true or false, got {value!r}"
    with pytest.raises(ConfigError) as err:
        LLM(tiny_model_dir, attn="torch", device="cpu", fast_paths={"compile": False})
    assert str(err.value) == (
        "fast_paths must be a minisgl_core.fast_paths.FastPaths, e.g. FastPaths().without('compile'); "
        "got dict"
    )
    assert err.value.fields == ("fast_paths",)


def test_a_switch_written_false_turns_its_path_off_and_nonsense_is_logged(caplog):
    """MINISGL_COMPILE=false left the path on: only "0" counted."""
    switches = fast_paths.from_env(
        {"MINISGL_COMPILE": "false", "MINISGL_FUSED_KV": "OFF", "MINISGL_TRITON_SILU": "no",
         "MINISGL_TRITON_NORM": "1", "MINISGL_TRITON_SAMPLER": "maybe"}
    )  # fmt: skip
    assert (switches.compile, switches.fused_kv, switches.triton_silu) == (False, False, False)
    assert switches.triton_norm and switches.triton_sampler and switches.split_k_norm
    assert "MINISGL_TRITON_SAMPLER='maybe' is neither 0 nor 1" in caplog.text

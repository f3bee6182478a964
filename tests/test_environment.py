"""Environment variables: read in one module, each documented, each the default of a flag or a
config field (or a location); no other product module reads ``os.environ``."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
from pathlib import Path

import pytest

import minisgl_core
from minisgl_core import environment
from minisgl_core.config import EngineConfig
from minisgl_core.config_args import add_engine_args
from minisgl_core.testing.cli_runner import run_cli

PACKAGE = Path(minisgl_core.__file__).parent
README = PACKAGE.parent / "README.md"

#: modules allowed to touch os.environ, and why
ALLOWED = {
    # the one place
    "environment.py": "reads every documented variable",
    # writes of third-party libraries' defaults, never reads of a minisgl switch
    "tokenizer/load.py": "os.environ.setdefault('TOKENIZERS_PARALLELISM', ...)",
    "distributed.py": "os.environ.setdefault of GLOO/NCCL_SOCKET_IFNAME (loopback)",
    "bench/tp.py": "os.environ.setdefault('NCCL_NVLS_ENABLE', '0')",
    # the test kit, not product code: a child interpreter's environment
    "testing/packaging_suite.py": "passes os.environ on to a subprocess",
    "testing/live_server.py": "passes os.environ on to the server it starts",
    "testing/triton_interpreter.py": "passes os.environ on to a kernel test's child process",
    "testing/cli_runner.py": "gives a forked CLI process the environment a test passes it",
}


def _environ_uses(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            lines.append(node.lineno)
    return lines


def test_no_product_module_reads_the_environment_but_one():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        lines = _environ_uses(path)
        if lines and name not in ALLOWED:
            found[name] = lines
    assert found == {}, f"read environment variables through minisgl_core.environment: {found}"


def test_every_variable_is_documented_in_the_readme():
    readme = README.read_text(encoding="utf-8")
    missing = [name for name in environment.DOCUMENTED if f"`{name}`" not in readme]
    assert missing == []


def _variables_read(path: Path) -> set[str]:
    """The names ``path`` reads from the environment: ``os.environ.get("X")``, ``os.environ["X"]``
    and ``os.getenv("X")`` with a string literal."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            target = ast.unparse(node.func)
            if target in ("os.environ.get", "os.getenv", "environ.get"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def test_every_variable_a_first_party_plugin_reads_is_in_the_readme():
    """Plugins may not import minisgl_core.environment (they build on the API), so three read a
    variable of their own; the README's table lists those too (it had said the core's module was
    the only reader, and two were missing)."""
    readme = README.read_text(encoding="utf-8")
    read: dict[str, str] = {}
    for path in sorted((PACKAGE.parent / "plugins").glob("*/*/minisgl_plugin_*/**/*.py")):
        for name in _variables_read(path):
            read[name] = path.relative_to(PACKAGE.parent).as_posix()
    assert {"MINISGL_FI_TENSOR_CORES", "MINISGL_XGRAMMAR_THREADS", "MINISGL_CACHE_DIR"} <= set(read), read
    missing = {name: where for name, where in read.items() if f"| `{name}` |" not in readme}
    assert missing == {}


def test_the_scan_finds_each_way_of_reading_a_variable(tmp_path):
    code = 'import os\nfrom os import environ\na = os.environ.get("A")\nb = os.environ["B"]\nc = os.getenv(\'C\')\nd = environ["D"]\n'
    (tmp_path / "m.py").write_text(code)
    assert _variables_read(tmp_path / "m.py") == {"A", "B", "C", "D"}


def test_only_documented_variables_can_be_read(monkeypatch):
    monkeypatch.setenv("MINISGL_CACHE_DIR", "/tmp/somewhere")
    assert environment.get("MINISGL_CACHE_DIR") == "/tmp/somewhere"
    assert environment.cache_dir() == Path("/tmp/somewhere")
    with pytest.raises(KeyError, match="not a documented"):
        environment.get("MINISGL_SOMETHING_NEW")


def test_step_trace_is_a_config_field_with_a_flag_and_an_environment_default(monkeypatch):
    monkeypatch.delenv("MINISGL_STEP_TRACE", raising=False)
    assert EngineConfig(model="m").step_trace is None
    monkeypatch.setenv("MINISGL_STEP_TRACE", "/tmp/steps.jsonl")
    assert EngineConfig(model="m").step_trace == "/tmp/steps.jsonl"
    assert EngineConfig(model="m", step_trace="/tmp/other.jsonl").step_trace == "/tmp/other.jsonl"
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    assert parser.parse_args(["--step-trace", "/tmp/x.jsonl"]).step_trace == "/tmp/x.jsonl"
    assert parser.parse_args([]).step_trace is None


def test_fast_path_variables_are_read_through_the_one_module(monkeypatch):
    from minisgl_core import fast_paths

    monkeypatch.setenv("MINISGL_FUSED_KV", "0")
    assert not fast_paths.from_env().fused_kv and fast_paths.from_env().compile
    assert set(fast_paths.ENV_VARS.values()) <= set(environment.DOCUMENTED)


@pytest.mark.parametrize(
    ("value", "default", "expected"),
    [("1", False, True), ("true", False, True), ("Yes", False, True), ("on", False, True),
     ("0", True, False), ("False", True, False), ("no", True, False), ("", True, True), ("", False, False),
     ("maybe", False, False), ("maybe", True, True)],
)  # fmt: skip
def test_on_off_variables_take_the_usual_spellings(monkeypatch, caplog, value, default, expected):
    """MINISGL_PDL=true and MINISGL_SPLIT_MIXED=true silently meant off (only "1" counted)."""
    monkeypatch.setattr(environment, "_warned", set())
    for name in ("MINISGL_PDL", "MINISGL_SPLIT_MIXED"):
        monkeypatch.setenv(name, value)
        assert environment.switch(name, default) is expected, (name, value)
    assert ("neither 0 nor 1" in caplog.text) == (value == "maybe")
    monkeypatch.delenv("MINISGL_PDL")
    assert environment.switch("MINISGL_PDL", default) is default


def _minisgl(*args: str, cache_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MINISGL_CACHE_DIR": cache_dir}
    return run_cli(args, env=env)


@pytest.mark.parametrize("model", [[], ["--model", "demo"]], ids=["default model", "demo model"])
def test_an_unusable_cache_dir_is_one_line_naming_the_variable_and_the_path(tmp_path, model):
    """A MINISGL_CACHE_DIR that is a file, or that cannot be created, was a NotADirectoryError or
    FileNotFoundError traceback from the first mkdir in it (fetching the default model, building
    the demo one)."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a directory")
    for cache, says in [
        (str(a_file), f"MINISGL_CACHE_DIR={a_file}: is not a directory; "),
        # (/proc takes no new entries, even from root)
        (
            "/proc/minisgl-cache",
            "MINISGL_CACHE_DIR=/proc/minisgl-cache: cannot write to it (/proc/minisgl-cache: ",
        ),
    ]:
        proc = _minisgl("generate", *model, "hi", "--device", "cpu", cache_dir=cache)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stdout == "", proc.stderr
        last = proc.stderr.splitlines()[-1]  # (--model demo warns first that its weights are random)
        assert last.startswith(f"minisgl: error: {says}"), last
        assert last.endswith("point MINISGL_CACHE_DIR at a directory you can write to"), last


def test_a_cache_dir_that_is_a_file_is_refused_by_the_accessor(tmp_path, monkeypatch):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(a_file))
    with pytest.raises(environment.CacheDirError, match=f"MINISGL_CACHE_DIR={a_file}: is not a directory"):
        environment.cache_dir()
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "new"))  # (made by whoever writes first)
    assert environment.cache_dir() == tmp_path / "new"


def test_a_cache_dir_name_too_long_to_look_up_is_refused_by_the_accessor(monkeypatch):
    """pathlib's exists raises ENAMETOOLONG where it answers False for a missing path: `serve
    --model demo` (and the default model's fetch) was an OSError traceback, twice over (the
    command line's handler asked the cache directory again)."""
    long = "/tmp/" + "x" * 300
    monkeypatch.setenv("MINISGL_CACHE_DIR", long)
    with pytest.raises(environment.CacheDirError) as refused:
        environment.cache_dir()
    assert str(refused.value) == (
        f"MINISGL_CACHE_DIR={long}: cannot be looked up (File name too long); point "
        "MINISGL_CACHE_DIR at a directory you can write to"
    )

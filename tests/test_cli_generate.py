"""`minisgl generate` prints one JSON line per prompt, readable by a person and by a program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minisgl_core.demo.factories import make_model_dir

#: the tiny model's greedy outputs for these prompts hold characters past ASCII
PROMPTS = ["Hello 🎉", "日本"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model") / "tiny-qwen3", "Qwen3ForCausalLM", seed=1)


def _generate(model_dir: Path, encoding: str) -> subprocess.CompletedProcess:
    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--max-context-len", "2048"]
    return subprocess.run(
        [sys.executable, "-m", "minisgl_core", "generate", *args, "--num-kv-tokens", "4096", *PROMPTS],
        capture_output=True,
        timeout=300,
        env={**os.environ, "PYTHONIOENCODING": encoding},
    )


def test_generate_prints_characters_not_escapes_and_falls_back_where_stdout_cannot(model_dir):
    """The lines were all escapes ("\\u0521"); with ensure_ascii off, a stdout that cannot encode
    a character must not turn the run into a UnicodeEncodeError traceback."""
    utf8 = _generate(model_dir, "utf-8")
    assert utf8.returncode == 0, utf8.stderr.decode()
    text = utf8.stdout.decode("utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == len(PROMPTS)
    assert any(not c.isascii() for line in lines for c in line["text"]), lines  # the test's premise
    assert "\\u" not in text
    assert text.splitlines() == [json.dumps(line, ensure_ascii=False) for line in lines]

    ascii_ = _generate(model_dir, "ascii")
    assert ascii_.returncode == 0 and b"Traceback" not in ascii_.stderr, ascii_.stderr.decode()
    assert [json.loads(line) for line in ascii_.stdout.decode("ascii").splitlines()] == lines


@pytest.fixture
def model_checks(monkeypatch) -> list[str]:
    """The model paths checked from now on (the command line's check and LLM()'s), in order."""
    from minisgl_core import llm
    from minisgl_core.checkpoint import path_check

    checked: list[str] = []
    check = path_check.check_model_path

    def counting(model):
        checked.append(str(model))
        return check(model)

    monkeypatch.setattr(path_check, "check_model_path", counting)
    monkeypatch.setattr(llm, "check_model_path", counting)
    return checked


def test_generate_checks_the_model_once(model_dir, model_checks, capsys):
    """The command line checks the model (with its messages); LLM.from_config does not again
    (the check reads every weight file's header and parses the tokenizer)."""
    from minisgl_core import cli

    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--num-kv-tokens", "512"]
    assert cli.main(["generate", *args, "--max-tokens", "2", "hi"]) == 0
    assert model_checks == [str(model_dir)]
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_bench_offline_checks_the_model_once(model_dir, model_checks):
    """As generate: engine_config_from_args checks the model, LLM.from_config takes it as checked
    (LLM() checked it a second time)."""
    from minisgl_core import cli

    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--num-kv-tokens", "4096"]
    try:
        cli.main(["bench", "offline", *args, "--num-requests", "1"])
    except SystemExit:  # a tiny model's vocabulary may be too small for the workload: started all the same
        pass
    assert model_checks == [str(model_dir)]


def test_generate_takes_the_models_other_sampling_defaults(model_dir, tmp_path, capsys):
    """--temperature and --max-tokens are the command's; the fields it has no flag for take the
    model's defaults (``--generation-config``), as LLM.generate's do. They were OpenAI's: a
    generation config of ``top_k: 1`` was checked and then ignored (a probe's find)."""
    from minisgl_core import cli

    (tmp_path / "generation_config.json").write_text(json.dumps({"top_k": 1}))
    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--num-kv-tokens", "512"]
    args += ["--max-tokens", "12", "--seed", "3", *PROMPTS]

    def texts(*extra: str) -> list[str]:
        assert cli.main(["generate", *args, *extra]) == 0
        return [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]

    greedy = texts("--temperature", "0", "--generation-config", "none")
    # top_k 1 keeps only the most likely token: sampling at temperature 1 is greedy then
    assert texts("--temperature", "1", "--generation-config", str(tmp_path)) == greedy
    # the control: without the file, temperature 1 samples something else
    assert texts("--temperature", "1", "--generation-config", "none") != greedy


def test_ctrl_c_ends_generate_with_status_130_and_no_traceback(model_dir):
    """Ctrl-C during `generate` printed a traceback through cli.py and llm.py."""
    import signal
    import time

    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--max-context-len", "2048"]
    # 32 prompts of up to 2,000 tokens: about two minutes here, so it outlasts the second it waits
    prompts = [f"Hello {i}" for i in range(32)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "minisgl_core", "generate", *args, "--max-tokens", "2000", *prompts],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: CI runs the tests in the background of a non-interactive shell, whose
        # jobs start with SIGINT ignored (generate then ran to its end, status 0)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = proc.stderr.readline()  # the weights' progress bar: the command is in main
        time.sleep(1)  # loading, or generating: Ctrl-C is quiet in both
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        err = first + err
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_ctrl_c_while_the_command_loads_lets_the_import_finish(monkeypatch):
    """A Ctrl-C while the command's modules import is noted, not raised there: raised, it could
    land in a pybind11 callback of torch's import and abort the process (status -6, "terminate
    called after throwing an instance of 'pybind11::error_already_set'", seen once in CI). The
    import finishes, the command does not run, the status is 130 and the former handler is back
    (Python's, raising KeyboardInterrupt; a pytest-xdist worker's ignores SIGINT)."""
    import signal

    from minisgl_core import entry

    steps = []
    before = signal.getsignal(signal.SIGINT)

    def load():
        os.kill(os.getpid(), signal.SIGINT)
        for i in range(100_000):  # Python code after the signal: where a handler would raise
            steps.append(i)
        return lambda: pytest.fail("the command ran after a Ctrl-C")

    monkeypatch.setattr(entry, "_load_cli", load)
    assert entry.main() == 130
    assert len(steps) == 100_000  # the import was not cut short
    assert signal.getsignal(signal.SIGINT) == before
    monkeypatch.setattr(entry, "_load_cli", lambda: lambda: 0)
    assert entry.main() == 0


@pytest.mark.parametrize("delay", [0.2, 0.6])
def test_ctrl_c_while_the_command_loads_is_quiet(delay):
    """A Ctrl-C in the first second of ``minisgl serve`` (its modules importing: torch alone takes
    over a second) printed a KeyboardInterrupt traceback; it stops with status 130, as later."""
    import signal
    import time

    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "minisgl_core", "serve", "--model", "demo", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # (as from a terminal)
        )
        try:
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        # (on a loaded machine the Ctrl-C can land while Python itself starts, importing site,
        # before any code of ours runs: "Fatal Python error: init_import_site", not ours to mend)
        if "init_import_site" not in err:
            break
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_the_entry_point_takes_a_ctrl_c_before_it_imports_anything_of_ours():
    """Until ``minisgl_core.entry`` has set its SIGINT handler, a Ctrl-C is a KeyboardInterrupt
    traceback; the package it sits in imported ``minisgl_core.sampling`` first (40 ms, most of the
    time before the handler), and on a loaded CI machine a Ctrl-C 0.2 s after start landed there."""
    code = (
        "import sys, minisgl_core.entry; "
        "print(sorted(m for m in sys.modules if m.startswith('minisgl_core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['minisgl_core', 'minisgl_core.entry']", out


def test_a_prompt_that_is_not_utf8_is_refused_before_the_model_loads(model_dir, monkeypatch, capsys):
    """A byte that is not UTF-8 reaches argv as a lone surrogate (surrogateescape); the LLM refused
    it once the model had loaded, calling it "a lone UTF-16 surrogate '\\udce9'"."""
    from minisgl_core import cli
    from minisgl_core.llm import LLM

    def loaded(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(LLM, "from_config", loaded)
    args = ["--model", str(model_dir), "--device", "cpu", "--attn", "torch", "--num-kv-tokens", "512"]
    assert cli.main(["generate", *args, "ok", os.fsdecode(b"caf\xe9")]) == 2
    assert capsys.readouterr().err == (
        "minisgl: error: prompt 2 is not valid UTF-8 text (a byte 0xe9 at character 3): pass text in UTF-8\n"
    )


def test_the_cli_module_runs_as_a_script():
    """``python -m minisgl_core.cli`` did nothing and exited 0 (no ``__main__`` guard)."""
    run = subprocess.run(
        [sys.executable, "-m", "minisgl_core.cli", "generate", "--help"], capture_output=True, timeout=120
    )
    assert run.returncode == 0 and b"prompt" in run.stdout, run


def test_version_names_the_distribution_and_the_plugin_api():
    """``minisgl --version`` (vLLM's and SGLang's commands take it) was "the following arguments
    are required: command"."""
    from minisgl_core import __version__
    from minisgl_core.api import API_VERSION

    done = subprocess.run(
        [sys.executable, "-m", "minisgl_core", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"minisgl {__version__} (plugin API {API_VERSION})"


@pytest.mark.parametrize("argv", [["-hello"], ["--max-tokens", "2", "-world"]])
def test_a_prompt_taken_for_a_flag_says_how_to_pass_it(argv, capsys):
    """``generate -hello`` was "argument -h/--help: ignored explicit argument 'ello'" and
    ``generate -world`` "the following arguments are required: prompt": neither said that a prompt
    starting with '-' goes after '--' (argparse's own rule), which the line now says."""
    from minisgl_core import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("minisgl generate: error: "), err
    assert "a prompt that starts with '-' goes after '--', as in minisgl generate -- '-hello'" in err
    # and what the line says works: the prompt reaches the command
    assert (
        cli.build_parser().parse_args(["generate", "--max-tokens", "2", "--", *argv[-1:]]).prompt == argv[-1:]
    )

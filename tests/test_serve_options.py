"""What `minisgl serve` does before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from minisgl_core.checkpoint import resolve


def test_serve_checks_the_model_once_before_starting(default_model_dir, monkeypatch):
    """The start-up check ran twice (the engine config's, then serve's own with the plugins): for
    the default GGUF its metadata parsed twice, and for a safetensors directory every header and
    the tokenizer read twice."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options

    checked: list[tuple[str, bool]] = []
    real = resolve.check_model

    def counting(path, plugins=None, max_context_len=None):
        checked.append((str(path), plugins is not None))
        return real(path, plugins, max_context_len)

    monkeypatch.setattr(resolve, "check_model", counting)
    args = build_parser().parse_args(["serve", "--model", str(default_model_dir), "--port", "0"])
    opts, _ = _serve_options(args)
    assert opts.runtime.config.model == str(default_model_dir)
    assert checked == [(str(default_model_dir), True)]  # once, with the plugins' weight formats


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from minisgl_core.demo.factories import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("m") / "tiny-llama", "LlamaForCausalLM")


@pytest.mark.parametrize(
    ("command", "name"), [("serve", ""), ("serve", "  "), ("shell", ""), ("shell", "\t")]
)
def test_an_empty_served_model_name_is_refused_naming_the_flag(model_dir, capsys, command, name):
    """An empty --served-model-name was taken as unset (the model directory's name was served);
    a blank one served a model id no client sends. Refused as the command line is read, before the
    model loads (the flag takes one name; ``shell --url`` sends it as the model)."""
    from minisgl_core.cli import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([command, "--model", str(model_dir), "--served-model-name", name])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"minisgl {command}: error: argument --served-model-name: got {name!r}: give the model id "
        "clients send as 'model', or leave the flag out to serve the model directory's name"
    ]


@pytest.mark.parametrize("text", ["You are a helpful assistant.\n", "chat_template.jinja", "{# a comment #}"])
def test_a_chat_template_file_without_jinja_is_refused_at_start_up(model_dir, tmp_path, text):
    """A file with no Jinja in it was served: every conversation rendered as that same text (the
    offline LLM(chat_template=...) refuses such text; serve now refuses it with the same check),
    before any process starts."""
    from minisgl_core.cli import build_parser
    from minisgl_core.config import ConfigError
    from minisgl_core.config_args import cli_message
    from minisgl_core.server.cli import _serve_options

    plain = tmp_path / "template.txt"
    plain.write_text(text)
    args = build_parser().parse_args(
        ["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu", "--chat-template", str(plain)]
    )
    with pytest.raises(ConfigError) as refused:
        _serve_options(args)
    assert cli_message(refused.value) == (
        f"--chat-template: {plain} has no Jinja in it (no {{{{ }}}} or {{% %}}); give a Jinja chat "
        "template file"
    )


@pytest.mark.parametrize(
    ("given", "name", "aliases"),
    [
        ([], None, ()),
        (["--served-model-name", "a"], "a", ()),
        (["--served-model-name", "a", "b", "a", "c"], "a", ("b", "c")),
    ],
)
def test_served_model_name_takes_several_names_the_first_one_answers(model_dir, given, name, aliases):
    """vLLM's --served-model-name takes several names (a request may send any); ours took one, and
    `--served-model-name a b` was "unrecognized arguments: b"."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options

    opts, _ = _serve_options(build_parser().parse_args(["serve", "--model", str(model_dir), *given]))
    assert (opts.served_model_name, opts.served_model_aliases) == (name, aliases)


def test_the_demo_model_answers_to_demo_too(monkeypatch, tmp_path):
    """`--model demo` is served as its directory's name, demo-qwen3: a request naming "demo" (the
    name the user gave) was a 404."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path))
    opts, _ = _serve_options(build_parser().parse_args(["serve", "--model", "demo"]))
    assert (opts.served_model_name, opts.served_model_aliases) == (None, ("demo",))
    opts, _ = _serve_options(
        build_parser().parse_args(["serve", "--model", "demo", "--served-model-name", "x"])
    )
    assert (opts.served_model_name, opts.served_model_aliases) == ("x", ())


def test_a_bundled_template_is_served_by_name_and_a_file_of_that_name_comes_first(
    model_dir, tmp_path, monkeypatch
):
    """``--chat-template chatml-tools`` serves the bundled template (it was 'cannot read
    chatml-tools'); a file of that name in the working directory is still the one read."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options
    from minisgl_core.tokenizer.chat_input import bundled_chat_template

    def served(cwd: Path) -> str | None:
        monkeypatch.chdir(cwd)
        argv = [
            "serve",
            "--model",
            str(model_dir),
            "--port",
            "0",
            "--device",
            "cpu",
            "--chat-template",
            "chatml-tools",
        ]
        return _serve_options(build_parser().parse_args(argv))[0].api.chat_template

    assert served(tmp_path) == bundled_chat_template("chatml-tools")
    own = "{% for m in messages %}{{ m.content }}{% endfor %}"
    (tmp_path / "chatml-tools").write_text(own)
    assert served(tmp_path) == own


@pytest.mark.parametrize(("given", "size"), [([], 1024), (["--responses-store-size", "3"], 3),
                                             (["--responses-store-size", "0"], 0)])  # fmt: skip
def test_responses_store_size_reaches_the_http_layer(model_dir, given, size):
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options

    opts, _ = _serve_options(build_parser().parse_args(["serve", "--model", str(model_dir), *given]))
    assert opts.api.responses_store_size == size


@pytest.mark.parametrize("value", ["-1", "many", "1.5"])
def test_a_responses_store_size_not_a_count_is_refused(value, capsys):
    from minisgl_core.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "demo", "--responses-store-size", value])
    assert "--responses-store-size: must be a whole number of responses, 0 or more" in capsys.readouterr().err


def test_a_chat_template_name_too_long_to_look_up_is_one_line():
    """It was an OSError traceback ("File name too long") from pathlib's exists, which raises
    ENAMETOOLONG where it answers False for a missing path; now it cannot be read, as a missing
    file, naming the flag and the bundled templates."""
    from minisgl_core.config import ConfigError
    from minisgl_core.server.cli import _read_chat_template

    long = "x" * 300
    with pytest.raises(ConfigError) as refused:
        _read_chat_template(long)
    assert str(refused.value) == (
        f"--chat-template: cannot read {long}: File name too long (give a template file, or a "
        "bundled template's name: chatml-tools)"
    )


@pytest.mark.parametrize("path", ["", "  "])
def test_an_empty_chat_template_path_is_refused_as_empty(path):
    """An empty path was read as the working directory ("cannot read : Is a directory"), a blank one as a
    file of that name; each is refused as empty, naming the flag and the way out."""
    from minisgl_core.config import ConfigError
    from minisgl_core.server.cli import _read_chat_template

    with pytest.raises(ConfigError) as refused:
        _read_chat_template(path)
    assert str(refused.value) == (
        f"--chat-template {path!r} is empty: give a Jinja chat template file or a bundled template's "
        "name (chatml-tools), or leave the flag out for the tokenizer's own template"
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--dist-init-addr", "127.0.0.1:29500"], "--dist-init-addr"),
        (["--tp-peer-timeout", "inf"], "--tp-peer-timeout"),
        (
            ["--dist-init-addr", "0.0.0.0:29500", "--tp-peer-timeout", "5"],
            "--dist-init-addr, --tp-peer-timeout",
        ),
    ],
)
def test_tensor_parallel_settings_without_tensor_parallelism_are_refused(model_dir, flags, named):
    """--tp 1 runs no TP group: these were accepted and used by nothing (no rendezvous is bound,
    no peer watched), as serve's shell flags without --shell were; refused before anything starts."""
    from minisgl_core.cli import build_parser
    from minisgl_core.config import ConfigError
    from minisgl_core.server.cli import _serve_options

    args = build_parser().parse_args(
        ["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu", *flags]
    )
    with pytest.raises(ConfigError) as refused:
        _serve_options(args)
    assert str(refused.value) == (
        f"{named}: the tensor-parallel ranks' settings, unused with --tp 1; leave "
        f"{'it' if ',' not in named else 'them'} out, or give --tp N"
    )


def test_an_attention_backend_without_prefill_alone_is_refused_before_anything_starts(model_dir, monkeypatch):
    """``--attn triton`` on a CPU under TRITON_INTERPRET=1 (triton declares decode only): the
    scheduler refused it once started, exit code 1, the line said twice; now the runner's own
    refusal, with its suggestion, before any process starts."""
    from minisgl_core.cli import build_parser
    from minisgl_core.plugins import PluginError
    from minisgl_core.server.cli import _serve_options

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = build_parser().parse_args(
        ["serve", "--model", str(model_dir), "--port", "0", "--device", "cpu", "--attn", "triton"]
    )
    with pytest.raises(PluginError) as refused:
        _serve_options(args)
    assert str(refused.value) == (
        "attention backend 'triton' does not run prefill steps (it does not declare 'prefill'); use it "
        "for decode only, e.g. --attn torch,triton"
    )


def test_a_dist_init_addr_on_the_http_port_is_refused_before_anything_starts(model_dir):
    """--port P with --dist-init-addr HOST:P passed both checks (each port was bound once and let
    go), then rank 0's rendezvous took the port and the HTTP server could not bind it once the
    model had loaded (exit code 1, uvicorn's "address already in use")."""
    from minisgl_core.cli import build_parser
    from minisgl_core.config import ConfigError
    from minisgl_core.server.cli import _serve_options

    args = build_parser().parse_args(
        ["serve", "--model", str(model_dir), "--device", "cpu", "--tp", "2", "--port", "29411"]
        + ["--dist-init-addr", "127.0.0.1:29411"]
    )
    with pytest.raises(ConfigError) as refused:
        _serve_options(args)
    assert str(refused.value) == (
        "--dist-init-addr 127.0.0.1:29411 is on the HTTP server's --port 29411: the TP rendezvous "
        "needs a port of its own; give another"
    )

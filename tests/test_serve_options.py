"""What `minisgl serve` does before any process starts."""

from __future__ import annotations

from minisgl_core.checkpoint import resolve


def test_serve_checks_the_model_once_before_starting(default_model_dir, monkeypatch):
    """The start-up check ran twice (the engine config's, then serve's own with the plugins): for
    the default GGUF its metadata parsed twice, and for a safetensors directory every header and
    the tokenizer read twice."""
    from minisgl_core.cli import build_parser
    from minisgl_core.server.cli import _serve_options

    checked: list[tuple[str, bool]] = []
    real = resolve.check_model

    def counting(path, plugins=None):
        checked.append((str(path), plugins is not None))
        return real(path, plugins)

    monkeypatch.setattr(resolve, "check_model", counting)
    args = build_parser().parse_args(["serve", "--model", str(default_model_dir), "--port", "0"])
    opts, _ = _serve_options(args)
    assert opts.runtime.config.model == str(default_model_dir)
    assert checked == [(str(default_model_dir), True)]  # once, with the plugins' weight formats

"""A model whose weight format's plugin is installed but not loaded says so, as the other kinds'
errors do, instead of asking to install what is installed."""

from __future__ import annotations

import pytest

from minisgl_core.cli import main


@pytest.mark.parametrize("how", ["env", "flag"])
def test_a_disabled_gguf_plugin_is_named_disabled_not_missing(default_model_dir, monkeypatch, capsys, how):
    args = ["generate", "--model", str(default_model_dir), "--max-tokens", "2", "hi"]
    if how == "env":
        monkeypatch.setenv("MINISGL_DISABLE_PLUGINS", "gguf")
    else:
        args[1:1] = ["--disable-plugin", "gguf"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "need minisgl-plugin-gguf" not in err
    assert "need plugin 'gguf' (minisgl-plugin-gguf " in err
    assert "is disabled: named in MINISGL_DISABLE_PLUGINS or --disable-plugin" in err


def test_a_gguf_plugin_that_is_not_installed_is_named_to_install(default_model_dir):
    from minisgl_core.checkpoint.formats import open_model
    from minisgl_core.plugins import Plugins

    with pytest.raises(FileNotFoundError, match=r"\(\.gguf files need minisgl-plugin-gguf\)$"):
        open_model(default_model_dir, Plugins.load(entry_points=[]))

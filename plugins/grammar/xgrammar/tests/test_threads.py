"""``MINISGL_XGRAMMAR_THREADS``: a value that is not a positive integer is logged and the default
used. ``int()`` of it had failed the plugin's import, so the server started without its default
grammar backend and the error named no variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from minisgl_plugin_xgrammar.backend import DEFAULT_COMPILE_THREADS, compile_threads


@pytest.mark.parametrize(
    ("value", "threads"),
    [
        (None, DEFAULT_COMPILE_THREADS),
        ("", DEFAULT_COMPILE_THREADS),
        ("4", 4),
        (" 2 ", 2),
        ("1", 1),
        ("64", 64),
    ],
)
def test_positive_integers_are_taken(value, threads, caplog):
    assert compile_threads(value) == threads
    assert "MINISGL_XGRAMMAR_THREADS" not in caplog.text


@pytest.mark.parametrize("value", ["abc", "0", "-3", "2.5", "65", "100000", str(10**20)])
def test_other_values_are_logged_and_the_default_used(value, caplog):
    assert compile_threads(value) == DEFAULT_COMPILE_THREADS
    assert f"MINISGL_XGRAMMAR_THREADS={value!r} is not an integer in [1, 64]" in caplog.text


def test_the_plugin_imports_with_a_bad_value():
    env = {**os.environ, "MINISGL_XGRAMMAR_THREADS": "abc"}
    code = "import minisgl_plugin_xgrammar.backend as b; print(b._COMPILE_THREADS)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(DEFAULT_COMPILE_THREADS)]
    assert "MINISGL_XGRAMMAR_THREADS='abc' is not an integer in [1, 64]" in done.stderr

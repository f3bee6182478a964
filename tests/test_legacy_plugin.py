"""A plugin written against API 1.x loaded on API 2.0 only, for one deprecation cycle: API 2.1
refuses it, saying what to do, and serves on without it.

``tests/fixtures/legacy_plugin`` is such a plugin, unchanged: it declares ``MINISGL_API = "1.4"``,
builds its model from ``minisgl_core.api.layers`` (removed in 2.1) and builds the page layout in
its own attention backend. Installed with pip, it is listed as incompatible, pointing its author
at "Migrating from 1.x", and nothing of it is imported. (The warning a plugin of the previous
major gets while it still loads is checked in ``tests/test_plugins.py``.) A 3.x plugin is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minisgl_core.api import API_VERSION

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "legacy_plugin"
DIST = "minisgl-plugin-legacy-example"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("legacy")
    src = shutil.copytree(FIXTURE, root / "src")  # building writes into the source tree
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(src)],
        check=True,
    )  # fmt: skip
    return target


def run_python(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def test_listed_as_incompatible_saying_how_to_port(site: Path) -> None:
    code = """
        import json, sys
        from minisgl_core.cli import main
        main(['plugins', '--json'])
        print(json.dumps(sorted(m for m in sys.modules if m.startswith('minisgl_plugin_legacy.'))), file=sys.stderr)
    """
    proc = run_python(site, code)
    assert proc.returncode == 0, proc.stderr
    plugins = {p["name"]: p for p in json.loads(proc.stdout)}
    legacy = plugins["legacy"]
    assert legacy["status"] == "incompatible" and legacy["api"] == "1.4"
    assert legacy["distribution"] == DIST
    assert legacy["reason"] == (
        f"needs minisgl API 1.4, core provides {API_VERSION}: upgrade {DIST} to a release for API {API_VERSION} "
        '(porting a plugin: docs/plugins.md, "Migrating from 1.x")'
    )
    assert legacy["provides"] == {} or not any(legacy["provides"].values())
    assert plugins["qwen3"]["status"] == "ok"  # the others load as before
    assert proc.stderr.strip().splitlines()[-1] == "[]"  # not one of its modules imported


def test_the_default_model_serves_with_it_installed(site: Path, tmp_path) -> None:
    code = f"""
        from pathlib import Path
        from minisgl_core.llm import LLM
        from minisgl_core.sampling import SamplingParams
        from minisgl_core.testing import make_model_dir
        model = make_model_dir(Path({str(tmp_path)!r}) / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256)
        with LLM(model, device="cpu", dtype="float32", attn="torch", page_size=4) as llm:
            out = llm.generate([[5, 17, 300]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        print(len(out[0].token_ids))
    """
    proc = run_python(site, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "4"
    assert "MinisglDeprecationWarning" not in proc.stderr


def test_api_versions_are_compatible_within_a_major_and_for_the_previous_one_a_minor() -> None:
    from minisgl_core.plugins import api_compatible, api_legacy, api_upgrade_hint

    # the rule as it stood at 2.0: the previous major (1.x) loads through its compatibility layer
    assert api_compatible("1.4", "2.0") and api_legacy("1.4", "2.0")
    assert api_compatible("1.0", "2.0") and api_compatible("1.6", "2.0")
    assert api_compatible("2.0", "2.0") and not api_legacy("2.0", "2.0")
    assert not api_compatible("2.1", "2.0")
    assert not api_compatible("0.9", "2.0")
    # and at 2.1: one cycle only
    assert not api_compatible("1.4", "2.1") and not api_legacy("1.4", "2.1")
    assert api_compatible("2.0", "2.1") and api_compatible("2.1", "2.1")
    assert not api_compatible("2.2", "2.1") and api_upgrade_hint("2.2", "x", "2.1") == "upgrade minisgl-core"
    assert not api_compatible("3.0", "2.1") and api_upgrade_hint("3.0", "x", "2.1") == "upgrade minisgl-core"
    assert api_upgrade_hint("1.4", "x", "2.1").startswith("upgrade x to a release for API 2.1 (porting")
    assert api_upgrade_hint("2.0", "x", "3.0") == (
        'upgrade x to a release for API 3.0 (porting a plugin: docs/plugins.md, "Migrating from 2.x")'
    )

"""A plugin written against API 1.x still loads and serves on API 2.0, for one deprecation cycle.

``tests/fixtures/legacy_plugin`` is such a plugin, unchanged: it declares ``MINISGL_API = "1.4"``,
builds its model from ``minisgl_core.api.layers`` and builds the page layout in its own attention
backend. Installed with pip, it must load (status ok, with a note), generate the same greedy
tokens as the first-party Qwen3 plugin and torch backend on the same weights, and warn naming
itself, its distribution and the import to use instead. A 3.x plugin is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_listed_as_ok_with_a_deprecation_note(site: Path) -> None:
    proc = run_python(site, "from minisgl_core.cli import main; main(['plugins', '--json'])")
    assert proc.returncode == 0, proc.stderr
    legacy = {p["name"]: p for p in json.loads(proc.stdout)}["legacy"]
    assert legacy["status"] == "ok" and legacy["api"] == "1.4"
    assert legacy["distribution"] == DIST
    assert "1.x compatibility layer" in legacy["reason"] and "Migrating from 1.x" in legacy["reason"]
    assert legacy["provides"]["models"] == ["LegacyQwen3ForCausalLM"]
    assert legacy["provides"]["attention"] == ["legacy-sdpa"]


SERVE = """
    import json, warnings
    from pathlib import Path
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import make_model_dir

    warnings.simplefilter("always")
    root = Path({root!r})
    qwen3 = make_model_dir(root / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256)
    legacy = root / "legacy"
    legacy.mkdir()
    for item in qwen3.iterdir():  # the same weights under the legacy plugin's architecture name
        (legacy / item.name).symlink_to(item)
    (legacy / "config.json").unlink()
    config = json.loads((qwen3 / "config.json").read_text())
    config["architectures"] = ["LegacyQwen3ForCausalLM"]
    (legacy / "config.json").write_text(json.dumps(config))

    prompts = [[5, 17, 300, 42, 9], [7] * 13, list(range(40, 75))]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = {{}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, path, attn in [("legacy", legacy, "legacy-sdpa"), ("reference", qwen3, "torch")]:
            with LLM(path, device="cpu", dtype="float32", attn=attn, page_size=4) as llm:
                outputs[name] = [o.token_ids for o in llm.generate(prompts, greedy)]
    print(json.dumps({{
        "outputs": outputs,
        "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
    }}))
"""


def test_serves_the_same_tokens_with_a_warning_naming_plugin_and_replacement(site: Path, tmp_path) -> None:
    proc = run_python(site, SERVE.format(root=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    legacy, reference = result["outputs"]["legacy"], result["outputs"]["reference"]
    assert len(legacy) == 3 and all(len(tokens) == 8 for tokens in legacy)
    assert legacy == reference
    deprecations = [
        (msg, filename) for cat, msg, filename in result["warnings"] if cat == "MinisglDeprecationWarning"
    ]
    messages = [msg for msg, _ in deprecations]
    model_warnings = [m for m in messages if "imports DecoderForCausalLM" in m]
    assert model_warnings == [
        f"minisgl_plugin_legacy.model ({DIST}) imports DecoderForCausalLM from minisgl_core.api.layers, "
        "which moved in minisgl API 2.0 and is removed in 2.1; use "
        "`from minisgl_core.layers import DecoderForCausalLM` instead"
    ]  # once, though two engines were built
    fused = [m for m in messages if "merge_attention_states" in m]
    assert len(fused) == 1 and fused[0].startswith(f"minisgl_plugin_legacy.attention ({DIST}) imports")
    assert "use `from minisgl_core.layers.fused import merge_attention_states`" in fused[0]
    # each points at the plugin's own import line
    for msg, filename in deprecations:
        if "imports" in msg:
            assert "minisgl_plugin_legacy" in filename, (msg, filename)


def test_plugin_loading_warns_naming_the_distribution(site: Path) -> None:
    code = """
        import warnings
        from minisgl_core.plugins import Plugins
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Plugins.load(allow=["legacy"])
        for w in caught:
            print(w.category.__name__, "|", w.message)
    """
    proc = run_python(site, code)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"MinisglDeprecationWarning | plugin 'legacy' ({DIST} 1.4.0) is written for minisgl API 1.4: "
        "runs through the 1.x compatibility layer, which API 2.1 removes" in proc.stdout
    )


def test_deprecation_is_shown_by_default(site: Path) -> None:
    """No -W flags: a user sees the warning (DeprecationWarnings are hidden by default in Python)."""
    code = "from minisgl_core.plugins import Plugins; Plugins.load(allow=['legacy'])"
    proc = run_python(site, code)
    assert proc.returncode == 0, proc.stderr
    assert "MinisglDeprecationWarning: plugin 'legacy'" in proc.stderr


def test_the_servers_processes_do_not_repeat_the_launchers_warning(site: Path) -> None:
    """Under ``serve`` the warning showed four times, once a process (launcher, tokenizer,
    detokenizer, scheduler); the processes the launcher starts load the plugins quietly."""
    code = """
        from minisgl_core.processes.child import load_plugins
        plugins = load_plugins(())
        print([i.status for i in plugins.infos if i.name == "legacy"])
    """
    proc = run_python(site, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['ok']"
    assert "MinisglDeprecationWarning" not in proc.stderr, proc.stderr


def test_a_plugin_for_the_next_major_is_refused() -> None:
    from minisgl_core.plugins import api_compatible, api_legacy, api_upgrade_hint

    assert api_compatible("1.4", "2.0") and api_legacy("1.4", "2.0")
    assert api_compatible("1.0", "2.0") and api_compatible("1.6", "2.0")
    assert api_compatible("2.0", "2.0") and not api_legacy("2.0", "2.0")
    assert not api_compatible("3.0", "2.0") and api_upgrade_hint("3.0", "x", "2.0") == "upgrade minisgl-core"
    assert not api_compatible("2.1", "2.0")
    assert not api_compatible("1.4", "2.1")  # one cycle only
    assert not api_compatible("0.9", "2.0")

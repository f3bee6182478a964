"""Real wheels: every distribution of the repository builds, declares what it imports, and installs
into a fresh virtualenv with only the plugins a generation needs, no editable installs.

One module-wide virtualenv (the slow part: torch and transformers from the local wheel cache):
the core wheel goes in once, then each scenario uninstalls every plugin, installs its own set from
the freshly built wheels only (``--no-index``: a plugin whose dependencies are not declared, or not
installable, fails here) and runs ``minisgl generate`` and ``minisgl plugins --json`` in it. The
template plugin also runs its own test suite there, as a third-party author would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from minisgl_core.testing.packaging_suite import (
    canonical,
    imported_top_levels,
    providers_of,
    requirement_name,
)

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIRS = sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml")) + [
    ROOT / "templates" / "plugin"
]
JUNK = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", ".venv", "tests")
GREEDY = ["--temperature", "0", "--max-tokens", "4"]
#: ``python -c BUILD_WHEELS OUT SOURCE...``: each source's declared PEP 517 backend builds its wheel
#: into OUT, all in one process with this environment's setuptools. It is what ``pip wheel
#: --no-deps --no-build-isolation`` ends in (the wheels are byte-for-byte the same), without pip's
#: three backend subprocesses per source: 31 builds took 56 s that way, 12 s this way.
BUILD_WHEELS = """
import importlib, os, sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
out = os.path.abspath(sys.argv[1])
os.makedirs(out, exist_ok=True)
for source in sys.argv[2:]:
    os.chdir(source)
    with open("pyproject.toml", "rb") as f:
        backend = tomllib.load(f)["build-system"]["build-backend"]
    module, _, attr = backend.partition(":")
    backend = importlib.import_module(module)
    for name in filter(None, attr.split(".")):
        backend = getattr(backend, name)
    backend.build_wheel(out)
"""


def run(*cmd: str | Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def wheel_metadata(wheel: Path) -> tuple[dict[str, list[str]], str]:
    """(headers of METADATA, entry_points.txt) of a wheel."""
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).rpartition("/")[0]
        message = Parser().parsestr(zf.read(f"{info}/METADATA").decode())
        entry_points = (
            zf.read(f"{info}/entry_points.txt").decode()
            if f"{info}/entry_points.txt" in zf.namelist()
            else ""
        )
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(value)
    return headers, entry_points


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Distribution name -> wheel, built from copies of the sources (the checkout stays clean)."""
    tmp = tmp_path_factory.mktemp("wheels")
    sources = []
    core = tmp / "src" / "core"
    core.mkdir(parents=True)
    shutil.copytree(ROOT / "minisgl_core", core / "minisgl_core", ignore=JUNK)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, core / name)
    sources.append(core)
    for plugin in PLUGIN_DIRS:
        sources.append(shutil.copytree(plugin, tmp / "src" / plugin.name, ignore=JUNK))
    out = tmp / "out"
    run(sys.executable, "-c", BUILD_WHEELS, out, *sources)
    built = {}
    for wheel in out.glob("*.whl"):
        built[canonical(wheel_metadata(wheel)[0]["Name"][0])] = wheel
    assert len(built) == len(PLUGIN_DIRS) + 1, sorted(built)
    return built


@pytest.fixture(scope="module")
def venv(wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the core wheel and its third-party dependencies, no plugin."""
    path = tmp_path_factory.mktemp("venv") / "env"
    run(sys.executable, "-m", "venv", "--without-pip", path)
    pip(path, "install", "--no-compile", "-c", ROOT / "constraints.txt", wheels["minisgl-core"])
    return path


def pip(venv: Path, *args: str | Path) -> str:
    return run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "-q",
        "--disable-pip-version-check",
        *args,
        env=clean_env(venv),
    )


def clean_env(venv: Path) -> dict[str, str]:
    """The test's environment without anything that would let the checkout's code leak in."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "MINISGL_PLUGINS", "MINISGL_DISABLE_PLUGINS", "PYTHONHOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def use_plugins(venv: Path, wheels: dict[str, Path], *dists: str, no_deps: bool = False) -> None:
    """Uninstall every plugin, then install ``dists`` from the built wheels only."""
    script = "import importlib.metadata as m; print(' '.join(d.metadata['Name'] for d in m.distributions()))"
    installed = [
        d
        for d in run(venv / "bin" / "python", "-c", script, env=clean_env(venv)).split()
        if canonical(d).startswith("minisgl-plugin-")
    ]
    if installed:
        pip(venv, "uninstall", "-y", *installed)
    flags = ["--no-deps"] if no_deps else []
    pip(
        venv,
        "install",
        "--no-compile",
        "--no-index",
        "--find-links",
        wheels["minisgl-core"].parent,
        *flags,
        *dists,
    )


def plugin_listing(venv: Path) -> dict[str, dict]:
    out = run(venv / "bin" / "minisgl", "plugins", "--json", env=clean_env(venv))
    return {p["name"]: p for p in json.loads(out)}


def generate(venv: Path, model_dir: Path, *options: str) -> list[int]:
    out = run(
        venv / "bin" / "minisgl",
        "generate",
        "--model",
        model_dir,
        "--device",
        "cpu",
        *options,
        *GREEDY,
        "the quick brown fox",
        env=clean_env(venv),
    )
    return json.loads(out.strip().splitlines()[-1])["token_ids"]


def expected_tokens(model_dir: Path, **options: str) -> list[int]:
    """The same generation in this process, on the checkout's editable installs."""
    from minisgl_core import LLM, SamplingParams

    llm = LLM(model_dir, device="cpu", **options)
    return llm.generate("the quick brown fox", SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)[
        0
    ].token_ids


def test_wheel_metadata_declares_dependencies_and_entry_points(
    wheels: dict[str, Path], tmp_path: Path
) -> None:
    core_files = zipfile.ZipFile(wheels["minisgl-core"]).namelist()
    assert (
        "minisgl_core/testing/policy_suite.py" in core_files and "minisgl_core/api/hookspecs.py" in core_files
    )
    assert not any(name.startswith("minisgl_plugin_") for name in core_files), (
        "plugins leaked into the core wheel"
    )
    modules = {dist.replace("-", "_"): dist for dist in wheels}  # each plugin's import name
    for dist, wheel in wheels.items():
        if dist == "minisgl-core":
            continue
        headers, entry_points = wheel_metadata(wheel)
        requires = {requirement_name(r) for r in headers.get("Requires-Dist", [])}
        assert "minisgl-core" in requires, f"{dist} does not depend on minisgl-core"
        plugin = dist.removeprefix("minisgl-plugin-")
        assert "[minisgl.plugins]" in entry_points and f"{plugin} = " in entry_points, (
            f"{dist}: {entry_points!r}"
        )
        unpacked = tmp_path / dist
        zipfile.ZipFile(wheel).extractall(unpacked)
        own = dist.replace("-", "_")
        for top, where in imported_top_levels(unpacked / own).items():
            if top in sys.stdlib_module_names or top in (own, "__future__"):
                continue
            provider = modules.get(top) or (providers_of(top) or ["?"])[0]
            assert canonical(provider) in requires, (
                f"{dist}: {where} imports {top} but {provider} is not declared"
            )


def test_core_with_qwen3_torch_radix_prefill_first(
    venv: Path, wheels: dict[str, Path], tmp_path: Path
) -> None:
    from minisgl_core.testing import make_model_dir

    plugins = [
        "minisgl-plugin-qwen3",
        "minisgl-plugin-torch",
        "minisgl-plugin-radix",
        "minisgl-plugin-prefill-first",
    ]
    use_plugins(venv, wheels, *plugins)
    listing = plugin_listing(venv)
    assert sorted(listing) == ["prefill-first", "qwen3", "radix", "torch"]
    assert all(p["status"] == "ok" for p in listing.values()), listing
    model_dir = make_model_dir(tmp_path / "qwen3", "Qwen3ForCausalLM")
    assert generate(venv, model_dir) == expected_tokens(model_dir)


def test_core_with_llama_naive_lpm_and_the_template(
    venv: Path, wheels: dict[str, Path], tmp_path: Path
) -> None:
    """lpm stands alone (it plans with the API's plan_prefill since API 2.5; it brought prefill-first,
    its declared dependency, before); the template provides the attention."""
    from minisgl_core.testing import make_model_dir

    use_plugins(
        venv,
        wheels,
        "minisgl-plugin-llama",
        "minisgl-plugin-naive",
        "minisgl-plugin-lpm",
        "minisgl-plugin-example",
    )
    listing = plugin_listing(venv)
    assert sorted(listing) == ["example", "llama", "lpm", "naive"]
    assert all(p["status"] == "ok" for p in listing.values()), listing
    model_dir = make_model_dir(tmp_path / "llama", "LlamaForCausalLM")
    tokens = generate(venv, model_dir, "--attn", "example", "--cache", "naive", "--policy", "lpm")
    assert tokens == expected_tokens(model_dir, attn="torch", cache="naive", policy="lpm")

    # The template's own tests, against the installed core wheel, outside this checkout.
    tests = shutil.copytree(ROOT / "templates" / "plugin" / "tests", tmp_path / "template_tests", ignore=JUNK)
    pip(venv, "install", "--no-compile", "pytest")
    out = run(
        venv / "bin" / "python",
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        tests,
        env=clean_env(venv),
    )
    assert re.search(r"\b\d+ passed", out) and " failed" not in out and " error" not in out, out[-2000:]


def test_gpu_plugins_install_and_load_without_their_kernels(venv: Path, wheels: dict[str, Path]) -> None:
    """fi and fa3 declare flashinfer-python, which is not installable on a CPU machine, so they go
    in with --no-deps: discovering them must still work, with no kernel imported."""
    for dist in ("minisgl-plugin-fi", "minisgl-plugin-fa3"):
        headers, _ = wheel_metadata(wheels[dist])
        assert any(r.startswith("flashinfer-python") for r in headers["Requires-Dist"]), headers[
            "Requires-Dist"
        ]
    use_plugins(venv, wheels, "minisgl-plugin-fi", "minisgl-plugin-fa3", no_deps=True)
    listing = plugin_listing(venv)
    assert sorted(listing) == ["fa3", "fi"]
    # They load (not "failed"); without a CUDA device or FlashInfer they cannot run, and say why.
    for name in ("fi", "fa3"):
        assert listing[name]["status"] == "unavailable", listing
        assert "no CUDA device" in listing[name]["reason"] or "flashinfer" in listing[name]["reason"], listing
    assert listing["fa3"]["provides"]["attention"] == ["fa3"]

"""Plugin discovery and isolation, with real distributions pip-installed while the tests run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest
import torch

from minisgl_core.api import API_VERSION
from minisgl_core.plugins import PluginError, Plugins, api_compatible, api_upgrade_hint, selection
from minisgl_core.testing.cli_runner import run_cli

# name -> module source; each becomes an entry point of one of two test distributions
GOOD = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_policies(register):
    register("test-fifo", "minisgl_test_plugins.impl:Fifo")
    register("dup", "minisgl_test_plugins.impl:Fifo")
"""
BROKEN_IMPORT = """
import this_module_does_not_exist  # noqa
MINISGL_API = "2.0"
"""
RAISING_HOOK = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_attention_backends(register):
    register("halfway", "minisgl_test_plugins.impl:Fifo")
    raise RuntimeError("kernel library missing")
"""
FUTURE_API = """
from minisgl_core.api import hookimpl
MINISGL_API = "9.0"

@hookimpl
def minisgl_register_caches(register):
    register("future", "minisgl_test_plugins.impl:Fifo")
"""
DUPLICATE = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_policies(register):
    register("dup", "minisgl_test_other.impl:Other")
"""
WRONG_KIND = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_attention_backends(register):
    register("policy-as-attn", "minisgl_test_plugins.impl:Fifo")
"""
IMPL = """
from minisgl_core.api import SchedulingPolicy

class Fifo(SchedulingPolicy):
    def schedule(self, state):
        return None
"""


def _write_dist(
    root: Path,
    dist: str,
    package: str,
    modules: dict[str, str],
    entry_points: dict[str, str],
    group: str = "minisgl.plugins",
) -> Path:
    src = root / dist
    (src / package).mkdir(parents=True)
    (src / package / "__init__.py").write_text("")
    for name, code in modules.items():
        (src / package / f"{name}.py").write_text(textwrap.dedent(code))
    eps = "\n".join(f'"{k}" = "{package}.{v}"' for k, v in entry_points.items())
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools>=64"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{dist}"
            version = "0.3.1"
            [project.entry-points."{group}"]
            """
        )
        + eps
        + f'\n[tool.setuptools]\npackages = ["{package}"]\n'
    )
    return src


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """Two plugin distributions, installed with pip into a private site directory."""
    root = tmp_path_factory.mktemp("plugins")
    first = _write_dist(
        root,
        "minisgl-test-plugins",
        "minisgl_test_plugins",
        {
            "good": GOOD,
            "broken": BROKEN_IMPORT,
            "raising": RAISING_HOOK,
            "future": FUTURE_API,
            "wrong_kind": WRONG_KIND,
            "impl": IMPL,
        },
        {
            "good": "good",
            "broken": "broken",
            "raising": "raising",
            "future": "future",
            "wrongkind": "wrong_kind",
        },
    )
    second = _write_dist(
        root, "minisgl-test-other", "minisgl_test_other", {"dup": DUPLICATE, "impl": IMPL}, {"other": "dup"}
    )
    # a plugin under a misspelt group: never discovered (named where a selection finds nothing)
    third = _write_dist(
        root,
        "minisgl-plugin-misgrouped",
        "minisgl_plugin_misgrouped",
        {"thin": GOOD.replace("test-fifo", "misgrouped-fifo").replace("dup", "misgrouped-dup"), "impl": IMPL},
        {"misgrouped": "thin"},
        group="minisgl_plugins",
    )
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(first), str(second), str(third)],
        check=True,
    )  # fmt: skip
    return target


def _minisgl(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        **env,
    }
    return run_cli(args, env=full_env)


def _listing(site: Path, *args: str, **env: str) -> dict[str, dict]:
    proc = _minisgl(site, "plugins", "--json", *args, **env)
    assert proc.returncode == 0, proc.stderr
    return {p["name"]: p for p in json.loads(proc.stdout)}


def test_installed_plugins_are_discovered_and_broken_ones_isolated(site):
    plugins = _listing(site)
    good = plugins["good"]
    # loaded, and flagged: "dup" is minisgl-test-other's too, so selecting it is an error
    assert good["status"] == "conflict"
    assert (
        "'dup' (minisgl_register_policies) is registered by minisgl-test-other (plugin 'other') too"
        in (good["reason"])
    )
    assert good["distribution"] == "minisgl-test-plugins" and good["version"] == "0.3.1"
    assert good["provides"]["policies"] == ["test-fifo", "dup"]
    assert plugins["broken"]["status"] == "failed"
    assert "this_module_does_not_exist" in plugins["broken"]["reason"]
    assert plugins["raising"]["status"] == "failed"
    assert "kernel library missing" in plugins["raising"]["reason"]
    assert plugins["raising"]["provides"]["attention"] == []  # half-registered names are dropped
    assert plugins["future"]["status"] == "incompatible"
    assert "upgrade minisgl-core" in plugins["future"]["reason"]
    # first-party plugins still load next to the broken ones
    assert plugins["torch"]["status"] == "ok" and plugins["radix"]["status"] == "ok"
    # each name's class, for a plugin that wraps another's (it had to read the plugin's source)
    assert plugins["torch"]["targets"] == {
        "attention": {"torch": "minisgl_plugin_torch.backend:TorchAttentionBackend"}
    }
    assert plugins["broken"]["targets"] == {}


def test_plugins_that_did_not_load_are_warned_of_once_and_fail_a_check(site):
    """``generate`` (and ``LLM()``) ran without a plugin whose import raised, saying nothing even
    at --log-level debug; only ``minisgl plugins`` showed it, and exited 0 all the same, so a
    plugin's CI could not check its install. Found by a third-party plugin walkthrough."""
    proc = _minisgl(site, "generate", "--model", "demo", "--max-tokens", "1", "hi")
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "is not loaded" in line]
    # broken, raising, future (a name two plugins share is an error where it is selected; a
    # class of the wrong kind, where its class is imported: neither is known at loading)
    assert len(warned) == 3, proc.stderr
    [broken] = [line for line in warned if "plugin 'broken'" in line]
    assert broken.endswith(
        "plugin 'broken' (minisgl-test-plugins 0.3.1) is not loaded (failed): import failed: "
        "ModuleNotFoundError: No module named 'this_module_does_not_exist'; `minisgl plugins` lists "
        "every plugin"
    ), broken
    listing = _minisgl(site, "plugins")  # its table says it: no warnings on top
    assert listing.returncode == 0 and "is not loaded" not in listing.stderr, listing.stderr
    check = _minisgl(site, "plugins", "--check")
    assert check.returncode == 1
    assert check.stderr.strip().splitlines()[-1] == (
        "minisgl: error: not loaded: broken, future, good, other, raising, wrongkind (see the status column)"
    ), check.stderr
    clean = _minisgl(site, "plugins", "--check", MINISGL_PLUGINS="torch,radix,prefill-first")
    assert clean.returncode == 0, clean.stderr


def test_a_plugin_under_another_entry_point_group_is_named_where_its_name_is_not_found(site):
    """A plugin declared under ``minisgl_plugins`` (or ``minisgl.plugin``) was never loaded, and
    selecting its name said only to install a package, already installed. Found by a third-party
    plugin walkthrough."""
    proc = _minisgl(site, "generate", "--policy", "misgrouped-fifo", "--max-tokens", "1", "hi")
    assert proc.returncode == 2
    assert (
        "installed but never loaded, having no 'minisgl.plugins' entry point: minisgl-plugin-misgrouped "
        "0.3.1 (entry-point groups: 'minisgl_plugins')"
    ) in proc.stderr, proc.stderr
    assert "misgrouped" not in _listing(site)


def test_selecting_a_broken_plugin_names_distribution_and_cause(site):
    proc = _minisgl(site, "generate", "--attn", "raising", "--max-tokens", "1", "hi")
    assert proc.returncode == 2
    assert "minisgl-test-plugins" in proc.stderr and "kernel library missing" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture
def site_on_path(site, monkeypatch):
    """The two test distributions importable in this process (a new interpreter for each check cost
    seconds of torch imports), their modules forgotten afterwards."""
    monkeypatch.syspath_prepend(str(site))
    yield
    for name in [m for m in sys.modules if m.split(".")[0] in ("minisgl_test_plugins", "minisgl_test_other")]:
        del sys.modules[name]


def _raised_text(error: BaseException) -> str:
    """What an uncaught ``error`` prints: its traceback, chained exceptions included."""
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def test_duplicate_names_from_two_distributions_are_an_error(site_on_path):
    with pytest.raises(PluginError) as raised:
        Plugins.load().resolve("policies", "dup")
    text = _raised_text(raised.value)
    assert "minisgl-test-plugins" in text and "minisgl-test-other" in text


def _assert_names_wrong_kind(message: str) -> None:
    for part in (
        "'wrongkind'",
        "minisgl-test-plugins",
        "minisgl_register_attention_backends",
        "AttentionBackend",
    ):
        assert part in message, (part, message)


def test_class_registered_under_the_wrong_kind_is_a_failed_plugin(site):
    listing = _listing(site)
    wrong = listing["wrongkind"]
    assert wrong["status"] == "failed"
    _assert_names_wrong_kind(wrong["reason"])
    assert wrong["provides"]["attention"] == []
    assert listing["good"]["status"] == "conflict"  # (dup) the same Fifo class is fine as a policy
    table = _minisgl(site, "plugins")
    assert table.returncode == 0 and "minisgl_register_attention_backends" in table.stdout


def test_selecting_a_class_of_the_wrong_kind_is_a_clear_error(site_on_path):
    with pytest.raises(PluginError) as raised:
        Plugins.load().resolve("attention", "policy-as-attn")
    text = _raised_text(raised.value)
    assert "PluginError" in text and "TypeError" not in text
    _assert_names_wrong_kind(text)


def test_allow_and_block_lists(site):
    only_good = _listing(site, MINISGL_PLUGINS="good")
    assert only_good["good"]["status"] == "ok"
    assert only_good["torch"]["status"] == "disabled"
    none = _listing(site, MINISGL_PLUGINS="")
    assert all(p["status"] == "disabled" for p in none.values())
    blocked = _listing(site, "--disable-plugin", "broken", MINISGL_DISABLE_PLUGINS="raising")
    assert blocked["broken"]["status"] == "disabled" and blocked["raising"]["status"] == "disabled"
    # the reason names the setting that did it
    assert "MINISGL_PLUGINS allow-list" in only_good["torch"]["reason"]
    for name in ("broken", "raising"):
        assert "MINISGL_DISABLE_PLUGINS or --disable-plugin" in blocked[name]["reason"]
    assert blocked["good"]["status"] == "conflict"  # loaded ("dup" is minisgl-test-other's too)


def test_a_name_to_disable_that_no_plugin_has_is_an_error_on_the_command_line(site):
    """A misspelt --disable-plugin left the plugin it meant loaded, silently: now an error listing
    the installed names; the environment's lists (which a deployment may share between hosts with
    different plugins) only warn."""
    proc = _minisgl(site, "plugins", "--disable-plugin", "brokn")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        "minisgl: error: no plugin named 'brokn' to disable; installed: "
    )
    assert "broken" in proc.stderr.splitlines()[-1]
    proc = _minisgl(site, "plugins", "--json", MINISGL_DISABLE_PLUGINS="raising,nosuch")
    assert proc.returncode == 0, proc.stderr
    listing = {p["name"]: p for p in json.loads(proc.stdout)}
    assert listing["raising"]["status"] == "disabled" and listing["good"]["status"] == "conflict"
    assert "'nosuch': no installed plugin has that name" in proc.stderr


def test_resolve_unknown_name_lists_installed_and_the_fix():
    """It said "pip install minisgl-plugin-NAME" for any name, a package no index has."""
    plugins = Plugins.load()
    with pytest.raises(
        PluginError,
        match=r"^unknown --attn 'nope'; installed: fa3, fi, torch, triton; install a plugin that registers it$",
    ):
        plugins.resolve("attention", "nope")
    with pytest.raises(PluginError, match="; install a plugin that registers it$"):
        plugins.resolve("models", "MambaForCausalLM")


def test_a_first_party_plugin_not_installed_is_named_by_its_folder_in_the_checkout(monkeypatch, tmp_path):
    """A plugin of this checkout that is not installed: its folder to ``pip install -e``, relative
    to the working directory when inside the checkout; a name with no folder names none."""
    from importlib import metadata

    import minisgl_core
    from minisgl_core.plugins import GROUP

    root = Path(minisgl_core.__file__).resolve().parent.parent
    entry_points = [ep for ep in metadata.entry_points(group=GROUP) if ep.name not in ("fi", "radix")]
    plugins = Plugins.load(entry_points=entry_points)
    monkeypatch.chdir(root)
    assert plugins.missing_message("attention", "fi") == (
        "unknown --attn 'fi'; installed: fa3, torch, triton; install it from this checkout: "
        "pip install -e plugins/attention/fi"
    )
    assert plugins.missing_message("caches", "radix").endswith("pip install -e plugins/cache/radix")
    monkeypatch.chdir(tmp_path)
    assert plugins.missing_message("caches", "radix").endswith(f"pip install -e {root}/plugins/cache/radix")
    for kind, name in [
        ("attention", "nope"),
        ("attention", "../cache/radix"),
        ("models", "MambaForCausalLM"),
    ]:
        assert plugins.missing_message(kind, name).endswith("; install a plugin that registers it"), name


def test_every_name_a_first_party_plugin_registers_is_found_in_its_checkout_folder():
    """checkout_plugin looked in a table of each kind's folder kept by hand, under a folder named
    by a rule of names: ``--quantization fp8-head``, a Gemma 2 or Mistral checkpoint, Qwen3-MoE and
    ``--reasoning-parser deepseek_r1`` without their plugin installed got "install a plugin that
    registers it", not the folder. Now read from the tree: every name each first-party plugin
    registers (as loaded) names its folder; a name of another kind names none."""
    import minisgl_core
    from minisgl_core.plugins import checkout_plugin

    tree = Path(minisgl_core.__file__).resolve().parent.parent / "plugins"
    folders = {path.parent for path in tree.glob("*/*/pyproject.toml")}
    found = set()
    for info in Plugins.load().infos:
        home = Path(info.module.__file__).resolve().parent.parent if info.module else None
        if home not in folders:
            continue  # (installed from elsewhere)
        for kind, names in info.provides.items():
            for name in names:
                assert checkout_plugin(kind, name) is not None, (kind, name)
                assert Path(checkout_plugin(kind, name)).resolve() == home, (kind, name)
                found.add(home)
    assert found == folders  # (each plugin of the tree is installed here: all were checked)
    assert checkout_plugin("caches", "torch") is None  # (an attention backend's name)
    assert checkout_plugin("models", "llama") is None  # (a folder's name, no architecture's)


@pytest.mark.parametrize(
    ("kind", "typed", "meant"),
    [
        ("attention", "flashinfr", "fi"),  # (SGLang's name, misspelt)
        ("attention", "flashinfer", "fi"),
        ("attention", "trtion", "triton"),
        ("caches", "radx", "radix"),
        ("policies", "prefill_first", "prefill-first"),
        ("grammars", "xgrammer", "xgrammar"),
        ("quantization", "INT8", "int8"),  # (another case: said "pip install minisgl-plugin-INT8")
        ("caches", "Radix", "radix"),
        ("attention", "AUTO", "auto"),  # (the core's choice: said "pip install minisgl-plugin-AUTO")
        ("quantization", "None", "none"),
    ],
)
def test_a_name_near_an_installed_one_is_suggested_not_a_plugin_to_install(kind, typed, meant):
    """``--attn flashinfr`` said "pip install minisgl-plugin-flashinfr": a guess at a package for
    what was a typo. The installed name it is near is suggested instead, as the user spells it."""
    for spelling in ("flag", "keyword"):
        with pytest.raises(PluginError) as err:
            Plugins.load(spelling=spelling).resolve(kind, typed)
        message = str(err.value)
        setting = selection(kind, meant, spelling)
        assert message.endswith(f"; did you mean {setting}?"), message
        assert "pip install" not in message, message


def test_a_name_near_none_installed_still_says_what_to_install(tmp_path):
    """No close name: a plugin to install (fp4 is no typo of fp8, nor Mamba of Llama)."""
    plugins = Plugins.load()
    for kind, name in [("quantization", "fp4"), ("attention", "nope"), ("models", "MambaForCausalLM")]:
        message = plugins.missing_message(kind, name)
        assert message.endswith("; install a plugin that registers it"), message
    from minisgl_core import LLM
    from minisgl_core.demo.factories import make_model_dir

    model_dir = make_model_dir(tmp_path / "m", "LlamaForCausalLM")
    with pytest.raises(
        PluginError, match=r"^unknown attn='trtion'; installed: .*; did you mean attn='triton'\?$"
    ):
        LLM(model_dir, attn="trtion", device="cpu")


def test_fingerprint_is_stable_and_sensitive():
    a, b = Plugins.load(), Plugins.load()
    assert a.fingerprint() == b.fingerprint()
    c = Plugins.load(disable=["naive"])
    assert c.fingerprint() != a.fingerprint()
    with pytest.raises(PluginError, match="different set of plugins"):
        c.check_fingerprint(a.fingerprint(), "scheduler rank 1")
    # with the launcher's state the message says what differs, not two digests and a list
    with pytest.raises(
        PluginError,
        match=r"the naive process .*: plugin 'naive' has status ok in the launcher, disabled here: named in "
        r"MINISGL_DISABLE_PLUGINS or --disable-plugin; plugin 'naive' registered caches \['naive'\] in the "
        r"launcher, \[\] here\. Install",
    ):
        c.check_fingerprint(a.fingerprint(), "the naive process", a.state())
    launcher = a.state()
    for row in launcher:
        if row[0] == "radix":
            row[4]["caches"] = [*row[4]["caches"], "radix-launcher-only"]
    with pytest.raises(
        PluginError,
        match=r"plugin 'radix' registered caches \['radix', 'radix-launcher-only'\] in the launcher, \['radix'\] here",
    ):
        a.check_fingerprint("0" * 16, "scheduler rank 1", launcher)


@pytest.mark.parametrize(("required", "ok"), [("1.0", True), ("1.9", False), ("0.9", False), ("2.0", False)])
def test_api_version_negotiation(required, ok):
    assert api_compatible(required, "1.0") is ok
    assert api_compatible("1.0", "1.3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the listing on a machine without CUDA")
def test_listing_says_which_backends_cannot_run_without_cuda():
    """fi and fa3 load fine but cannot run here: the listing says so instead of "ok", text and json."""
    listed = {p["name"]: p for p in json.loads(run_cli(["plugins", "--json"]).stdout)}
    for name in ("fi", "fa3"):
        assert listed[name]["status"] == "unavailable", listed[name]
        assert listed[name]["reason"].startswith("no CUDA device (the"), listed[name]
    assert listed["torch"]["status"] == "ok" and listed["torch"]["reason"] is None
    assert listed["radix"]["status"] == "ok"
    table = run_cli(["plugins"]).stdout.splitlines()
    fi_row = next(i for i, line in enumerate(table) if line.startswith("fi "))
    assert table[fi_row].split()[4] == "unavailable"
    assert table[fi_row + 1].split(":", 1)[0].strip() == "unavailable"
    assert "no CUDA device" in table[fi_row + 1]
    torch_row = next(line for line in table if line.startswith("torch "))
    assert torch_row.split()[4] == "ok"


def test_api_versions_compare_as_versions_not_strings():
    assert api_compatible("1.9", "1.10") and not api_compatible("1.10", "1.9")
    assert api_upgrade_hint("1.10", "minisgl-plugin-x", "1.9") == "upgrade minisgl-core"
    assert api_upgrade_hint("2.0", "minisgl-plugin-x", "1.10") == "upgrade minisgl-core"
    assert "upgrade minisgl-plugin-x" in api_upgrade_hint("0.9", "minisgl-plugin-x", "1.10")
    for malformed in ("1", "1.0.0", "1.x", "v1.0"):
        with pytest.raises(ValueError, match="major.minor"):
            api_compatible(malformed, "1.0")


def test_an_empty_plugin_name_says_a_name_is_needed():
    """``--quantization ""`` suggested ``pip install minisgl-plugin-``."""
    from minisgl_core.plugins import Plugins

    plugins = Plugins.load()
    message = plugins.missing_message("quantization", "")
    assert message.startswith("--quantization needs a name; installed: ") and "pip install" not in message


# --- distributions written in place, as pip --target leaves them (no pip: each test stays fast) ---


def _fake_site(root: Path, dists: dict[str, tuple[dict[str, str], dict[str, str]]]) -> Path:
    """``{distribution: ({module path: source}, {entry-point name: value})}`` as a site directory:
    each distribution's modules and its ``.dist-info`` (METADATA, entry_points.txt)."""
    site = root / "site"
    for dist, (modules, entry_points) in dists.items():
        for path, code in modules.items():
            file = site / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(textwrap.dedent(code))
        info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        eps = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[minisgl.plugins]\n{eps}")
    return site


def _thin(package: str, hooks: str, api: str = '"2.0"') -> dict[str, str]:
    """A thin module ``package/__init__.py`` with ``hooks``, and ``package/impl.py`` holding a policy."""
    return {
        f"{package}/__init__.py": f"from minisgl_core.api import hookimpl\nMINISGL_API = {api}\n"
        + textwrap.dedent(hooks),
        f"{package}/impl.py": IMPL,
    }


@pytest.fixture
def load_fake(tmp_path, monkeypatch):
    """Plugins.load() with the given fake distributions installed next to the first-party ones."""

    def load(dists, **kwargs) -> Plugins:
        monkeypatch.syspath_prepend(str(_fake_site(tmp_path, dists)))
        return Plugins.load(**kwargs)

    monkeypatch.delenv("MINISGL_PLUGINS", raising=False)
    monkeypatch.delenv("MINISGL_DISABLE_PLUGINS", raising=False)
    return load


def test_two_distributions_with_one_plugin_name_are_both_in_conflict_and_neither_loaded(load_fake):
    """A distribution whose entry point was named ``lpm`` replaced the repository's lpm plugin,
    silently (the second entry point of a name was dropped as "the same distribution twice").
    Neither is loaded now: MINISGL_DISABLE_PLUGINS=lpm could not say which it means."""
    plugins = load_fake({"minisgl-test-shadow": (_thin("t3_shadow", SHADOW_HOOKS), {"lpm": "t3_shadow"})})
    rows = {row["distribution"]: row for row in plugins.listing() if row["name"] == "lpm"}
    assert sorted(rows) == ["minisgl-plugin-lpm", "minisgl-test-shadow"]
    for row in rows.values():
        assert row["status"] == "conflict", row
        assert "plugin name 'lpm' is the entry point of both minisgl-plugin-lpm" in row["reason"]
        assert "minisgl-test-shadow 0.1.0" in row["reason"] and "uninstall one" in row["reason"]
    assert "lpm" not in plugins.names("policies") and "shadow-pol" not in plugins.names("policies")
    # selecting what either would provide says why, naming both distributions
    for name in ("lpm", "shadow-pol"):
        with pytest.raises(PluginError) as raised:
            plugins.resolve("policies", name)
        message = str(raised.value)
        assert "plugin name 'lpm' is the entry point of both minisgl-plugin-lpm" in message, message
        assert "minisgl-test-shadow" in message
    assert "plugin 'lpm' (minisgl-plugin-lpm" in plugins.missing_message("policies", "lpm")


SHADOW_HOOKS = """
@hookimpl
def minisgl_register_policies(register):
    register("shadow-pol", "t3_shadow.impl:Fifo")
"""


def test_the_same_distribution_seen_twice_is_loaded_once_quietly(tmp_path, monkeypatch, caplog):
    """One distribution on two sys.path entries (spelt with ``_`` in one) is no name clash."""
    from importlib import metadata

    from minisgl_core.plugins import GROUP

    dist = (_thin("t8_twice", SHADOW_HOOKS.replace("t3_shadow", "t8_twice")), {"twice": "t8_twice"})
    first = _fake_site(tmp_path / "a", {"minisgl-test-twice": dist})
    second = _fake_site(tmp_path / "b", {"minisgl_test_twice": dist})
    monkeypatch.syspath_prepend(str(first))
    eps = [
        ep
        for d in metadata.distributions(path=[str(first), str(second)])
        for ep in d.entry_points
        if ep.group == GROUP
    ]
    assert len(eps) == 2
    with caplog.at_level("WARNING", logger="minisgl_core.plugins"):
        plugins = Plugins.load(allow=None, entry_points=eps)
    assert [(i.name, i.status) for i in plugins.infos] == [("twice", "ok")]
    assert plugins.resolve("policies", "shadow-pol").__module__ == "t8_twice.impl"
    assert not caplog.records


def test_a_stale_egg_info_beside_the_dist_info_is_named_with_the_one_used(tmp_path, monkeypatch, caplog):
    """A build leaves ``*.egg-info`` in a plugin's source folder; on PYTHONPATH beside the
    ``.dist-info`` meant, importlib.metadata found both and kept the first, and the plugin loaded
    (or failed) with the stale version and entry points, silently. A warning now names both
    folders and says which is used: importlib.metadata's pick, which minisgl loads. One
    distribution twice with the same metadata (two sys.path entries) stays quiet."""
    from importlib import metadata

    import minisgl_core.plugins as plugins_module
    from minisgl_core.plugins import GROUP

    hooks = SHADOW_HOOKS.replace("t3_shadow", "t9_stale")
    site = _fake_site(tmp_path, {"minisgl-test-stale": (_thin("t9_stale", hooks), {"t9stale": "t9_stale"})})
    stale = site / "minisgl_test_stale.egg-info"
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: minisgl-test-stale\nVersion: 0.0.1\n")
    (stale / "entry_points.txt").write_text("[minisgl.plugins]\nt9stale = t9_stale_old\n")
    twice = (_thin("t8_twice", SHADOW_HOOKS.replace("t3_shadow", "t8_twice")), {"twice": "t8_twice"})
    for copy in ("a", "b"):
        monkeypatch.syspath_prepend(str(_fake_site(tmp_path / copy, {"minisgl-test-twice": twice})))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("MINISGL_PLUGINS", raising=False)
    monkeypatch.delenv("MINISGL_DISABLE_PLUGINS", raising=False)
    monkeypatch.setattr(plugins_module, "_WARNED_SHADOWED", set(), raising=False)
    # the reference: the distribution importlib.metadata gives the entry point of
    [picked] = [ep.dist for ep in metadata.entry_points(group=GROUP) if ep.name == "t9stale"]
    paths = {str(d._path) for d in metadata.distributions(name="minisgl-test-stale")}
    assert paths == {str(stale), str(site / "minisgl_test_stale-0.1.0.dist-info")}, paths
    with caplog.at_level("WARNING", logger="minisgl_core.plugins"):
        plugins = Plugins.load()
        Plugins.load()  # (said once a process)
    [row] = [row for row in plugins.listing() if row["name"] == "t9stale"]
    assert row["version"] == picked.version
    [hidden] = paths - {str(picked._path)}
    warnings = [r.getMessage() for r in caplog.records if "minisgl-test" in r.getMessage()]
    assert warnings == [
        f"distribution minisgl-test-stale has metadata in more than one place: using {picked._path} "
        f"(version {picked.version}), not {hidden} (version {'0.1.0' if picked.version == '0.0.1' else '0.0.1'}); "
        "remove the stale one (e.g. a *.egg-info a build left in the plugin's source folder)"
    ], caplog.text
    assert [(i.name, i.status) for i in plugins.infos if i.name == "twice"] == [("twice", "ok")]


def test_selecting_a_name_of_a_plugin_that_did_not_load_names_it_and_the_cause(load_fake):
    """Only a plugin named like the selection was named (``--attn fi``): for any other name the
    error said "unknown ... pip install", although the plugin was installed and its cause known."""
    raising = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t5-raised", "t5_raising.impl:Fifo")
        raise RuntimeError("registration exploded")
    """
    newer = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t5-newer", "t5_newer.impl:Fifo")
    """
    plugins = load_fake(
        {
            "minisgl-test-raising": (_thin("t5_raising", raising), {"t5raising": "t5_raising"}),
            "minisgl-test-newer": (_thin("t5_newer", newer, api='"9.0"'), {"t5newer": "t5_newer"}),
            "minisgl-test-noimport": (
                {"t5_noimport/__init__.py": "import t5_no_such_kernel_library\n"},
                {"t5noimport": "t5_noimport"},
            ),
        },
        disable=["lpm"],
    )
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t5-raised")
    assert "plugin 't5raising' (minisgl-test-raising 0.1.0) failed to load" in str(raised.value)
    assert "registration exploded" in str(raised.value) and "pip install" not in str(raised.value)
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t5-newer")
    assert "plugin 't5newer' (minisgl-test-newer 0.1.0) is incompatible" in str(raised.value)
    assert "upgrade minisgl-core" in str(raised.value)
    # what a disabled plugin, or one that failed to import, registers is unknown: both are named
    message = plugins.missing_message("policies", "t5-other")
    assert "plugin that failed to load: 't5noimport' (minisgl-test-noimport 0.1.0" in message
    assert "t5_no_such_kernel_library" in message and "disabled plugin: lpm" in message
    assert "t5newer" not in message and "t5raising" not in message  # their names are known


def test_a_name_of_a_plugin_failed_by_another_of_its_hooks_names_that_plugin(load_fake):
    """A plugin whose cache hook raised, or whose policy hook was misspelt, failed, and selecting
    a policy it registers said "unknown --policy ...; it may be provided by" every failed plugin
    installed: the names its other hooks register, and a misspelt hook's, were never asked for."""
    raising = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t40-pol", "t40_raising.impl:Fifo")

    @hookimpl
    def minisgl_register_caches(register):
        raise RuntimeError("cache registration exploded")
    """
    typo = """
    @hookimpl
    def minisgl_register_policy(register):
        register("t40-typo-pol", "t40_typo.impl:Fifo")
    """
    extra = """
    @hookimpl
    def minisgl_register_policies(register, options):
        register("t40-extra-pol", "t40_extra.impl:Fifo")
    """
    plugins = load_fake(
        {
            "minisgl-test-raising40": (_thin("t40_raising", raising), {"t40raising": "t40_raising"}),
            "minisgl-test-typo40": (_thin("t40_typo", typo), {"t40typo": "t40_typo"}),
            "minisgl-test-extra40": (_thin("t40_extra", extra), {"t40extra": "t40_extra"}),
        }
    )
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t40-pol")
    assert str(raised.value) == (
        "--policy 't40-pol' is unavailable: plugin 't40raising' (minisgl-test-raising40 0.1.0) failed "
        "to load: hook minisgl_register_caches raised RuntimeError: cache registration exploded"
    )
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t40-typo-pol")
    assert str(raised.value) == (
        "--policy 't40-typo-pol' is unavailable: plugin 't40typo' (minisgl-test-typo40 0.1.0) failed to "
        "load: invalid hooks: minisgl_register_policy is not a minisgl hook (did you mean "
        "minisgl_register_policies?)"
    )
    # a registration hook taking an argument the hook does not pass: asked with None for it
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t40-extra-pol")
    assert str(raised.value).startswith(
        "--policy 't40-extra-pol' is unavailable: plugin 't40extra' (minisgl-test-extra40 0.1.0) failed to "
        "load: invalid hooks: minisgl_register_policies takes options, which the hook does not pass"
    ), raised.value
    # all are known now, so a name none registers does not list them as candidates
    message = plugins.missing_message("policies", "t40-neither")
    assert "t40raising" not in message and "t40typo" not in message and "t40extra" not in message, message


COLLIDE_HOOKS = """
@hookimpl
def minisgl_register_policies(register):
    register("prefill-first", "t6_collide.impl:Fifo")

@hookimpl
def minisgl_register_attention_backends(register):
    # (a class of the right kind: a start checks every class of a plugin it selects from)
    register("torch", "minisgl_plugin_torch.backend:TorchAttentionBackend")
"""


def test_a_name_two_distributions_register_is_an_error_naming_both(load_fake):
    """The core picks neither (a repository plugin's name is no exception), explicitly selected or
    as the default alike; disabling one plugin makes the name the other's."""
    from minisgl_core.config import EngineConfig

    plugins = load_fake(
        {"minisgl-test-collide": (_thin("t6_collide", COLLIDE_HOOKS), {"collide": "t6_collide"})}
    )
    for kind, name in (("policies", EngineConfig.policy), ("attention", "torch")):
        with pytest.raises(PluginError) as raised:
            plugins.resolve(kind, name)
        message = str(raised.value)
        assert f"plugin {name!r}" in message and "minisgl-test-collide (plugin 'collide')" in message
        assert "uninstall one" in message and "MINISGL_DISABLE_PLUGINS" in message
    alone = Plugins.load(disable=["prefill-first"])
    assert alone.resolve("policies", "prefill-first").__module__ == "t6_collide.impl"
    assert (
        Plugins.load(disable=["collide"])
        .resolve("policies", "prefill-first")
        .__module__.startswith("minisgl_plugin_prefill_first")
    )


def test_a_shared_name_of_a_plugin_that_failed_is_the_others(load_fake):
    """A plugin that fails after registering a name another plugin has is not used, so the name is
    no collision (it stayed one when the failing plugin loaded after the other: named after it)."""
    hooks = """
    @hookimpl
    def minisgl_register_attention_backends(register):
        register("torch", "t9_failing.impl:Fifo")

    @hookimpl
    def minisgl_register_policies(register):
        raise RuntimeError("registration exploded")
    """
    plugins = load_fake({"minisgl-test-failing": (_thin("t9_failing", hooks), {"zfailing": "t9_failing"})})
    assert next(i for i in plugins.infos if i.name == "zfailing").status == "failed"
    assert plugins.resolve("attention", "torch").__module__.startswith("minisgl_plugin_torch")
    assert {row["name"]: row for row in plugins.listing()}["torch"]["status"] == "ok"


def test_every_plugin_registering_a_shared_name_is_listed_in_conflict(load_fake):
    """``minisgl plugins`` listed both ``ok`` and the repository's torch as "unavailable: no CUDA
    device (... is provided by both ...)" when another distribution registered ``torch`` too."""
    plugins = load_fake(
        {"minisgl-test-collide": (_thin("t6_collide", COLLIDE_HOOKS), {"collide": "t6_collide"})}
    )
    rows = {row["name"]: row for row in plugins.listing()}
    for plugin, other in (
        ("collide", "minisgl-plugin-prefill-first (plugin 'prefill-first')"),
        ("collide", "minisgl-plugin-torch (plugin 'torch')"),
        ("prefill-first", "minisgl-test-collide (plugin 'collide')"),
        ("torch", "minisgl-test-collide (plugin 'collide')"),
    ):
        assert rows[plugin]["status"] == "conflict", rows[plugin]
        assert f"is registered by {other} too" in rows[plugin]["reason"], rows[plugin]
        assert "--disable-plugin" in rows[plugin]["reason"]
    assert "no CUDA" not in rows["torch"]["reason"]
    with pytest.raises(PluginError, match="--disable-plugin"):
        plugins.resolve("attention", "torch")


def test_the_listing_keeps_a_collision_of_a_plugin_whose_classes_do_not_import(load_fake):
    """``minisgl plugins`` (which imports every class) marked such a plugin failed and forgot its
    names, so the repository plugin it collides with showed ``ok``, while every start, which
    imports only what it selects, failed on the collision (found by a probe)."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("prefill-first", "t8_gone.impl:NoSuchPolicy")
    """
    plugins = load_fake({"minisgl-test-gone": (_thin("t8_gone", hooks), {"gone": "t8_gone"})})
    plugins.check_classes()
    rows = {row["name"]: row for row in plugins.listing()}
    assert rows["gone"]["status"] == "failed" and "does not import" in rows["gone"]["reason"]
    assert rows["prefill-first"]["status"] == "conflict", rows["prefill-first"]
    assert "minisgl-test-gone (plugin 'gone')" in rows["prefill-first"]["reason"]
    # as a start (no class check) finds it
    with pytest.raises(PluginError, match="minisgl-test-gone"):
        Plugins.load().resolve("policies", "prefill-first")


def test_api_declared_as_a_number_says_to_quote_it(load_fake):
    """MINISGL_API = 2.0 was reported as "declares no MINISGL_API (e.g. MINISGL_API = "1.0")"."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t7-pol", "t7_float.impl:Fifo")
    """
    plugins = load_fake(
        {
            "minisgl-test-float": (_thin("t7_float", hooks, api="2.0"), {"t7float": "t7_float"}),
            "minisgl-test-none": ({"t7_none/__init__.py": ""}, {"t7none": "t7_none"}),
            "minisgl-test-int": (
                _thin("t7_int", hooks.replace("t7_float", "t7_int"), api="2"),
                {"t7int": "t7_int"},
            ),
        }
    )
    infos = {i.name: i for i in plugins.infos}
    assert infos["t7int"].reason == 'MINISGL_API is 2 (int); declare it as a string: MINISGL_API = "2.0"'
    assert infos["t7float"].status == "incompatible" and infos["t7float"].api is None
    assert (
        infos["t7float"].reason == 'MINISGL_API is 2.0 (float); declare it as a string: MINISGL_API = "2.0"'
    )  # (the version it meant: the core's newest, suggested before, refuses every older core)
    # (the oldest it needs, as docs/plugins.md says: the core's newest was given as the example)
    assert infos["t7none"].reason == (
        f'declares no MINISGL_API: declare the oldest plugin API it needs, e.g. MINISGL_API = "2.0" '
        f'(this core serves up to "{API_VERSION}")'
    )


def test_an_api_string_not_major_minor_says_what_to_declare(load_fake):
    """MINISGL_API = "2" or "2.5.1" was "is not 'major.minor'", leaving the author to guess the
    form (a float is refused too); the reason now gives the line it meant."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("PKG-pol", "PKG.impl:Fifo")
    """
    declared = {"t42_major": '"2"', "t42_patch": '"2.5.1"', "t42_v": '"v2.5"', "t42_word": '"latest"'}
    plugins = load_fake(
        {
            f"minisgl-test-{package}": (
                _thin(package, hooks.replace("PKG", package), api=api),
                {package.replace("_", ""): package},
            )
            for package, api in declared.items()
        }
    )
    reasons = {i.name: i.reason for i in plugins.infos if i.name.startswith("t42")}
    assert reasons == {
        "t42major": "MINISGL_API '2' is not 'major.minor': declare MINISGL_API = \"2.0\"",
        "t42patch": "MINISGL_API '2.5.1' is not 'major.minor': declare MINISGL_API = \"2.5\"",
        "t42v": "MINISGL_API 'v2.5' is not 'major.minor': declare MINISGL_API = \"2.5\"",
        "t42word": "MINISGL_API 'latest' is not 'major.minor': declare the oldest API it needs as "
        f'"major.minor", e.g. MINISGL_API = "{API_VERSION}"',
    }
    with pytest.raises(PluginError, match="t42major.*is incompatible: MINISGL_API '2' is not"):
        plugins.resolve("policies", "t42_major-pol")


def test_legacy_warning_once_a_process_pointing_at_the_plugin(load_fake, monkeypatch):
    """The 1.x deprecation was shown twice per command (the command line loads plugins twice) and
    pointed at minisgl_core/plugins.py. (API 2.1 ended 1.x's cycle: the loader is given 2.0's
    rule here, as a core in the next major's first minor will have it for 2.x.)"""
    import warnings

    import minisgl_core.plugins as loader

    compatible, legacy = loader.api_compatible, loader.api_legacy
    monkeypatch.setattr(
        loader, "api_compatible", lambda required, provided="2.0": compatible(required, provided)
    )
    monkeypatch.setattr(loader, "api_legacy", lambda required, provided="2.0": legacy(required, provided))

    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t8-pol", "t8_legacy.impl:Fifo")
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_fake(
            {"minisgl-test-legacy": (_thin("t8_legacy", hooks, api='"1.4"'), {"t8legacy": "t8_legacy"})}
        )
        Plugins.load()
    mine = [w for w in caught if "'t8legacy'" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in mine]
    assert mine[0].filename.endswith("t8_legacy/__init__.py") and mine[0].lineno == 2


def test_hook_mistakes_fail_the_plugin_saying_what_is_wrong(load_fake):
    """A misspelt hook, a hook without @hookimpl or with an argument the hook never passes: the
    first two were listed "ok" (providing nothing), the last as pluggy's three-line message."""
    typo = """
    @hookimpl
    def minisgl_register_policys(register):
        register("t9-pol", "t9_typo.impl:Fifo")

    def minisgl_register_caches(register):
        register("t9-cache", "t9_typo.impl:Fifo")
    """
    extra = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t9-extra", "t9_extra.impl:Fifo")

    @hookimpl
    def minisgl_process_start(ctx, extra_arg):
        pass
    """
    plugins = load_fake(
        {
            "minisgl-test-typo": (_thin("t9_typo", typo), {"t9typo": "t9_typo"}),
            "minisgl-test-extra": (_thin("t9_extra", extra), {"t9extra": "t9_extra"}),
            "minisgl-test-nohooks": (_thin("t9_nohooks", ""), {"t9nohooks": "t9_nohooks"}),
        }
    )
    infos = {i.name: i for i in plugins.infos}
    assert infos["t9typo"].status == "failed"
    assert "minisgl_register_policys is not a minisgl hook (did you mean minisgl_register_policies?)" in (
        infos["t9typo"].reason
    )
    assert "minisgl_register_caches lacks @hookimpl" in infos["t9typo"].reason
    assert infos["t9extra"].status == "failed" and "\n" not in infos["t9extra"].reason
    assert "minisgl_process_start takes extra_arg, which the hook does not pass" in infos["t9extra"].reason
    assert infos["t9nohooks"].status == "ok"  # loads (the fingerprint is the same everywhere) ...
    plugins.check_classes()  # ... and `minisgl plugins` says what is wrong
    assert infos["t9nohooks"].status == "failed" and "implements no minisgl hook" in infos["t9nohooks"].reason
    with pytest.raises(PluginError, match="'t9extra'.*failed to load"):
        plugins.resolve("policies", "t9-extra")


def test_a_plugin_failing_only_in_a_worker_says_why_in_the_fingerprint_error(load_fake):
    """A thin module whose import fails only in a server's worker process stopped the server with
    "has status ok in the launcher, failed here", and its ImportError's text was nowhere."""
    worker_only = {"t25_worker/__init__.py": "raise ImportError('libfoo.so not found in worker')\n"}
    launcher = Plugins.load().state() + [
        ["t25worker", "minisgl-test-worker", "0.1.0", "ok", {"policies": []}]
    ]
    here = load_fake({"minisgl-test-worker": (worker_only, {"t25worker": "t25_worker"})})
    with pytest.raises(PluginError) as raised:
        here.check_fingerprint("0" * 16, "the detokenizer process", launcher)
    assert (
        "plugin 't25worker' has status ok in the launcher, failed here: import failed: ImportError: "
        "libfoo.so not found in worker" in str(raised.value)
    ), raised.value


def test_a_registration_hook_that_returns_its_names_fails_the_plugin(load_fake):
    """``return {"name": "module:Class"}`` in place of ``register(...)`` was listed ok, providing
    nothing, and selecting the name said to pip install a plugin that does not exist (a probe)."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        return {"t24-pol": "t24_retdict.impl:Fifo"}
    """
    plugins = load_fake(
        {"minisgl-test-retdict": (_thin("t24_retdict", hooks), {"t24retdict": "t24_retdict"})}
    )
    info = next(i for i in plugins.infos if i.name == "t24retdict")
    assert info.status == "failed"
    assert info.reason == "minisgl_register_policies returned a dict; call register(name, target) instead"
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t24-pol")
    assert str(raised.value).startswith(
        "--policy 't24-pol' is unavailable: plugin 't24retdict' (minisgl-test-retdict 0.1.0) failed to load: "
        "minisgl_register_policies returned a dict"
    ), raised.value


@pytest.mark.parametrize("name", ["", " spaced name", "a,b", "-dash", "tab\there"])
def test_a_name_no_flag_could_select_fails_the_plugin(load_fake, name):
    """``register("", ...)`` and ``register("a b,c", ...)`` were taken: ``minisgl plugins`` and
    ``--help`` listed them (``installed: , a b,c``) and ``--policy ""`` selected the first, while a
    comma splits a flag's value into two names. Found by a third-party plugin walkthrough."""
    package = f"t21_names{len(name)}"  # one each (a module imports once a run)
    hooks = f"""
    @hookimpl
    def minisgl_register_policies(register):
        register("t21-fine", "{package}.impl:Fifo")
        register({name!r}, "{package}.impl:Fifo")
    """
    plugins = load_fake({"minisgl-test-names": (_thin(package, hooks), {"t21names": package})})
    info = next(i for i in plugins.infos if i.name == "t21names")
    assert info.status == "failed"
    assert info.reason == (
        f"hook minisgl_register_policies raised ValueError: register() got the name {name!r}: a name "
        "is letters, digits and '_', '-', '.', '+', starting with a letter or digit (no spaces; a "
        "comma separates names)"
    )
    assert "t21-fine" not in plugins.names("policies") and name not in plugins.names("policies")


def test_the_listing_says_when_a_registered_class_does_not_import(load_fake):
    """check_classes skipped targets that did not import, so ``minisgl plugins`` said ok."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t10-pol", "t10_missing.impl:NoSuchPolicy")
        register("t10-fine", "t10_missing.impl:Fifo")
    """
    plugins = load_fake(
        {"minisgl-test-missing": (_thin("t10_missing", hooks), {"t10missing": "t10_missing"})}
    )
    plugins.check_classes()
    info = next(i for i in plugins.infos if i.name == "t10missing")
    assert info.status == "failed"
    assert (
        "'t10-pol' (minisgl_register_policies) names t10_missing.impl:NoSuchPolicy, which does not import"
        in (info.reason)
    )
    assert "AttributeError" in info.reason
    assert "failed" in plugins.format_table().split("t10missing", 1)[1].splitlines()[0]
    with pytest.raises(PluginError, match="'t10missing'.*failed to load"):
        plugins.resolve("policies", "t10-fine")
    assert next(i for i in plugins.infos if i.name == "torch").status == "ok"  # first-party classes import


def test_a_plugin_with_one_class_that_does_not_import_provides_none_of_its_names(load_fake):
    """``minisgl plugins`` listed such a plugin ``failed``, providing nothing, yet a start used its
    other names and the unknown-name error listed them all as installed (found by a probe)."""
    hooks = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t13-fine", "t13_partial.impl:Fifo")
        register("t13-typo", "t13_partial.impl:Fifoo")
    """
    dists = {"minisgl-test-partial": (_thin("t13_partial", hooks), {"t13partial": "t13_partial"})}
    cause = "'t13-typo' (minisgl_register_policies) names t13_partial.impl:Fifoo, which does not import"
    plugins = load_fake(dists)
    with pytest.raises(PluginError) as raised:  # a start selecting the name that imports
        plugins.resolve("policies", "t13-fine")
    message = str(raised.value)
    assert message.startswith(
        "--policy 't13-fine' is unavailable: plugin 't13partial' (minisgl-test-partial 0.1.0) failed to load: "
    ), message
    assert cause in message and "AttributeError" in message
    row = {row["name"]: row for row in plugins.listing()}["t13partial"]
    assert row["status"] == "failed" and cause in row["reason"] and not any(row["provides"].values())
    # the unknown-name error of a fresh start lists none of its names as installed
    message = Plugins.load().missing_message("policies", "t13-other")
    assert "installed: lpm, prefill-first, priority;" in message, message
    assert "t13-fine" not in message and "t13-typo" not in message, message


def test_an_entry_point_naming_an_attribute_says_to_name_the_module(load_fake):
    plugins = load_fake(
        {"minisgl-test-epattr": (_thin("t12_epattr", ""), {"t12epattr": "t12_epattr:Missing"})}
    )
    info = next(i for i in plugins.infos if i.name == "t12epattr")
    assert info.status == "failed"
    assert "the entry point's value must be the thin module itself, t12epattr = 't12_epattr'" in info.reason


def test_offline_process_start_sees_plugin_options_at_the_top_level(load_fake):
    """Under serve ``ctx.options["example_max_wait"]``; offline the same option sat in
    ``ctx.options["plugin_options"]``, so a plugin reading it as documented got a KeyError."""
    from minisgl_core.llm import LLM

    hooks = """
    SEEN = []

    @hookimpl
    def minisgl_register_policies(register):
        register("t11-pol", "t11_options.impl:Fifo")

    @hookimpl
    def minisgl_add_cli_options(parser):
        parser.add_argument("--t11options-max-wait", type=int, default=32, help="rounds")
        parser.add_argument("--t11options-tag", default="none", help="a tag")

    @hookimpl
    def minisgl_process_start(ctx):
        SEEN.append(dict(ctx.options))
        raise RuntimeError("seen: stop before the model loads")
    """
    load_fake({"minisgl-test-options": (_thin("t11_options", hooks), {"t11options": "t11_options"})})
    with pytest.raises(PluginError, match="seen: stop"):
        LLM("demo", plugin_options={"t11options_max_wait": 3}, max_running_requests=4)
    import t11_options

    [options] = t11_options.SEEN
    assert options["t11options_max_wait"] == 3 and "plugin_options" not in options
    assert options["max_running_requests"] == 4
    # the options not given are there at their defaults, as under serve
    assert options["t11options_tag"] == "none"
    # a misspelt option was taken silently (the plugin read its default)
    with pytest.raises(ValueError, match=r"plugin_options has 't11options_maxwait', which no installed plugin's "
                       r"options has; did you mean 't11options_max_wait'\?"):  # fmt: skip
        LLM("demo", plugin_options={"t11options_maxwait": 3})
    # and a plugin's option given as LLM's own keyword says where it goes
    with pytest.raises(TypeError, match=r"'t11options_max_wait': it is a plugin's option; pass it as "
                       r"plugin_options=\{'t11options_max_wait': 9\}"):  # fmt: skip
        LLM("demo", t11options_max_wait=9)
    assert len(t11_options.SEEN) == 1  # (both refused before any process hook)


# ---------------------------------------------------------------- a plugin author's mistakes
# (found by a probe writing plugins from docs/plugins.md: each case named the wrong thing, or one
# broken plugin took the others down with it)

BROKEN_OPTIONS = """
@hookimpl
def minisgl_add_cli_options(parser):
    raise RuntimeError("cli boom")

@hookimpl
def minisgl_process_stop(ctx):
    raise RuntimeError("stop boom")
"""

GOOD_OPTIONS = """
STOPPED = []

@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t21good-max-wait", type=int, default="32", help="rounds")

@hookimpl
def minisgl_process_stop(ctx):
    STOPPED.append(ctx.role)
"""


HALF_OPTIONS = """
@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t22half-x", type=int, default=1)
    raise RuntimeError("half boom")
"""

CLASHING_OPTIONS = """
@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t23clash-y", type=int, default=1)
    parser.add_argument("--port", type=int, default=1)
"""


def test_options_of_a_hook_that_raised_or_clashed_are_left_out_whole(load_fake, caplog):
    """A hook that raised after adding an option left that option in ``--help``, parsed, and in
    ``LLM(plugin_options=...)``'s defaults, where the docs say its options are left out; a hook
    whose option clashes with the core's (``--port``) took the whole command line down. Each
    plugin's options now join the parser only when its hook returns and nothing clashes."""
    import argparse
    import logging

    from minisgl_core.server.cli import _add_plugin_args

    plugins = load_fake(
        {
            "minisgl-test-half": (_thin("t22_half", HALF_OPTIONS), {"t22half": "t22_half"}),
            "minisgl-test-clash": (_thin("t23_clash", CLASHING_OPTIONS), {"t23clash": "t23_clash"}),
            "minisgl-test-good": (_thin("t21_good", GOOD_OPTIONS), {"t21good": "t21_good"}),
        }
    )
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    with caplog.at_level(logging.WARNING, logger="minisgl_core.server.cli"):
        _add_plugin_args(parser, plugins)
    args = parser.parse_args(["--t21good-max-wait", "5", "--port", "9"])
    assert args.t21good_max_wait == 5 and args.port == 9
    for refused in (["--t22half-x", "3"], ["--t23clash-y", "3"]):
        with pytest.raises(SystemExit):
            parser.parse_args(refused)
    assert "--t22half-x" not in parser.format_help() and "--t23clash-y" not in parser.format_help()
    assert "hook minisgl_add_cli_options raised RuntimeError: half boom" in caplog.text, caplog.text
    assert "plugin 't23clash'" in caplog.text and "--port" in caplog.text, caplog.text
    defaults = plugins.option_defaults()
    assert defaults["t21good_max_wait"] == 32
    assert "t22half_x" not in defaults  # (offline no core option is there to clash with)


CORE_FLAG_OPTIONS = """
SEEN = []

@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t26core-level", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=7)

@hookimpl
def minisgl_process_start(ctx):
    SEEN.append(dict(ctx.options))
    raise RuntimeError("seen: stop before the model loads")
"""


def test_offline_leaves_out_the_options_of_a_plugin_taking_a_core_flag(load_fake, caplog):
    """Serve leaves out the options of a plugin one of whose takes a core flag (--page-size);
    offline kept them all, so every plugin's ctx.options["page_size"] was that plugin's default
    and ``plugin_options={"page_size": 4}`` was taken (found by a probe)."""
    import logging

    from minisgl_core.llm import LLM

    load_fake({"minisgl-test-coreflag": (_thin("t26_core", CORE_FLAG_OPTIONS), {"t26core": "t26_core"})})
    with caplog.at_level(logging.WARNING, logger="minisgl_core.llm"):
        with pytest.raises(PluginError, match="seen: stop"):
            LLM("demo", page_size=2)
    import t26_core

    [options] = t26_core.SEEN
    assert "t26core_level" not in options and options.get("page_size") != 7, options
    assert (
        "plugin 't26core' (minisgl-test-coreflag 0.1.0) hook minisgl_add_cli_options: --page-size is "
        "taken by the core" in caplog.text
    ), caplog.text
    with pytest.raises(
        ValueError, match=r"plugin_options has 'page_size', .*it is LLM's own setting: pass page_size=4"
    ):
        LLM("demo", plugin_options={"page_size": 4})
    with pytest.raises(
        ValueError,
        match=r"plugin_options has 't26core_level', .*plugin 't26core': its CLI options were left out: "
        r"--page-size is taken by the core",
    ):
        LLM("demo", plugin_options={"t26core_level": 3})
    assert len(t26_core.SEEN) == 1  # (both refused before any process hook)


def test_the_listing_fails_a_plugin_whose_options_are_left_out(load_fake, capsys):
    """A plugin whose options serve leaves out (one takes a core flag, or its hook raised) was
    listed ``ok`` with no reason, and ``minisgl plugins --check`` exited 0."""
    import argparse

    from minisgl_core.cli import _cmd_plugins

    load_fake(
        {
            "minisgl-test-coreflag": (_thin("t26_core", CORE_FLAG_OPTIONS), {"t26core": "t26_core"}),
            "minisgl-test-half": (_thin("t22_half", HALF_OPTIONS), {"t22half": "t22_half"}),
            "minisgl-test-good": (_thin("t21_good", GOOD_OPTIONS), {"t21good": "t21_good"}),
        }
    )
    args = argparse.Namespace(disable_plugin=[], json=True, check=True)
    assert _cmd_plugins(args) == 1
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["t26core"]["status"] == "conflict"
    assert rows["t26core"]["reason"] == "its CLI options were left out: --page-size is taken by the core"
    assert rows["t22half"]["status"] == "failed"
    assert rows["t22half"]["reason"] == (
        "hook minisgl_add_cli_options raised RuntimeError: half boom, so its CLI options were left out"
    )
    assert rows["t21good"]["status"] == "ok" and rows["t21good"]["reason"] is None


def test_a_flag_of_a_plugin_without_its_options_says_why(load_fake, capsys):
    """``serve --t23clash-y 2`` for a plugin whose options were left out (its hook took ``--port``,
    or raised), or that did not load, was "unrecognized arguments: --t23clash-y 2" and no more: the
    warning that said why had scrolled by, or (a plugin not loaded) there was none."""
    from minisgl_core.cli import build_parser

    future = """
    @hookimpl
    def minisgl_add_cli_options(parser):
        parser.add_argument("--t43future-x", type=int, default=1)
    """
    plugins = load_fake(
        {
            "minisgl-test-clash": (_thin("t23_clash", CLASHING_OPTIONS), {"t23clash": "t23_clash"}),
            "minisgl-test-broken": (_thin("t20_broken", BROKEN_OPTIONS), {"t20broken": "t20_broken"}),
            "minisgl-test-future": (_thin("t43_future", future, api='"9.0"'), {"t43future": "t43_future"}),
            "minisgl-test-good": (_thin("t21_good", GOOD_OPTIONS), {"t21good": "t21_good"}),
        }
    )
    parser = build_parser(plugins)

    def error_of(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(argv)
        assert exited.value.code == 2
        return capsys.readouterr().err.strip()

    assert error_of(["serve", "--t23clash-y", "2"]) == (
        "minisgl: error: unrecognized arguments: --t23clash-y 2; --t23clash-y looks like an option of "
        "plugin 't23clash' (minisgl-test-clash 0.1.0): its CLI options were left out: --port is taken "
        "by the core"
    )
    assert error_of(["shell", "--t20broken_limit=3"]).endswith(
        "; --t20broken_limit looks like an option of plugin 't20broken' (minisgl-test-broken 0.1.0): "
        "hook minisgl_add_cli_options raised RuntimeError: cli boom, so its CLI options were left out"
    )
    assert error_of(["serve", "--t43future-x", "1"]).endswith(
        "; --t43future-x looks like an option of plugin 't43future' (minisgl-test-future 0.1.0): it is "
        "incompatible (needs minisgl API 9.0, core provides " + API_VERSION + ": upgrade minisgl-core), "
        "so its options are not available"
    )
    # a plugin whose options joined, and a flag of no plugin, are argparse's plain error
    assert parser.parse_args(["serve", "--t21good-max-wait", "4"]).t21good_max_wait == 4
    assert (
        error_of(["serve", "--t21good-other", "1"])
        == "minisgl: error: unrecognized arguments: --t21good-other 1"
    )


def test_a_flag_of_a_plugin_disabled_by_the_flag_is_a_usage_error(load_fake, monkeypatch, capsys):
    """``serve --disable-plugin t21good --t21good-max-wait 5`` was taken, the option doing nothing:
    the parser is built (with every plugin's options) before --disable-plugin is read. It is now
    the usage error that ``MINISGL_DISABLE_PLUGINS=t21good`` gives, saying the plugin is disabled."""
    from minisgl_core.cli import main

    load_fake({"minisgl-test-good": (_thin("t21_good", GOOD_OPTIONS), {"t21good": "t21_good"})})
    note = (
        "--t21good-max-wait looks like an option of plugin 't21good' (minisgl-test-good 0.1.0): it is "
        "disabled (named in MINISGL_DISABLE_PLUGINS or --disable-plugin), so its options would do "
        "nothing; drop them, or enable the plugin"
    )
    missing = str(Path(__file__).parent / "no-such-model")  # (a start that got this far stops here)
    for command in ("serve", "shell"):
        with pytest.raises(SystemExit) as exited:
            main([command, "--disable-plugin", "t21good", "--t21good-max-wait", "5", "--model", missing])
        assert exited.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err == f"minisgl: error: unrecognized arguments: --t21good-max-wait 5; {note}", err
    # the variable said so already; the flag alone, without the option, still starts (to the model check)
    monkeypatch.setenv("MINISGL_DISABLE_PLUGINS", "t21good")
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--t21good-max-wait=5", "--model", missing])
    assert exited.value.code == 2 and capsys.readouterr().err.strip().endswith(note)
    monkeypatch.delenv("MINISGL_DISABLE_PLUGINS")
    assert main(["serve", "--disable-plugin", "t21good", "--model", missing]) == 2
    assert "no-such-model: no such file or directory" in capsys.readouterr().err


CHECKED_OPTIONS = """
SEEN = []

@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t27typed-flag", choices=["a", "b"], default="a")
    parser.add_argument("--t27typed-max-wait", type=int, default=32)
    parser.add_argument("--t27typed-verbose", action="store_true")
    parser.add_argument("--t27typed-tag", action="append", type=int, default=[])

@hookimpl
def minisgl_process_start(ctx):
    SEEN.append(dict(ctx.options))
    raise RuntimeError("seen: stop before the model loads")
"""


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"t27typed_flag": "zzz"}, "option --t27typed-flag takes one of 'a', 'b'"),
        ({"t27typed_flag": 5}, "option --t27typed-flag takes one of 'a', 'b'"),
        ({"t27typed_max_wait": "nine"}, "option --t27typed-max-wait takes int values: invalid literal"),
        ({"t27typed_max_wait": 9.5}, "option --t27typed-max-wait takes int values, got float"),
        ({"t27typed_verbose": "yes"}, "option --t27typed-verbose is a switch: pass True or False"),
        ({"t27typed_tag": [1, "x"]}, "option --t27typed-tag takes int values: invalid literal"),
    ],
)
def test_plugin_options_are_checked_as_the_command_line_checks_them(load_fake, given, message):
    """``plugin_options`` values went to the plugin as given: a choice the option does not offer,
    a string for an int option ("nine", which serve's argparse refuses) (found by a probe)."""
    from minisgl_core.config import ConfigError
    from minisgl_core.llm import LLM

    load_fake({"minisgl-test-typed": (_thin("t27_typed", CHECKED_OPTIONS), {"t27typed": "t27_typed"})})
    with pytest.raises(ConfigError) as raised:
        LLM("demo", plugin_options=given)
    assert str(raised.value).startswith(
        f"plugin_options={given!r}: plugin 't27typed' (minisgl-test-typed 0.1.0) "
    )
    assert message in str(raised.value), raised.value
    assert raised.value.fields == ("plugin_options",)


def test_plugin_options_given_as_strings_are_converted(load_fake):
    from minisgl_core.llm import LLM

    load_fake({"minisgl-test-typed": (_thin("t27_typed", CHECKED_OPTIONS), {"t27typed": "t27_typed"})})
    with pytest.raises(PluginError, match="seen: stop"):
        LLM(
            "demo",
            plugin_options={"t27typed_max_wait": "9", "t27typed_flag": "b", "t27typed_verbose": True,
                            "t27typed_tag": [3, "4"]},
        )  # fmt: skip
    import t27_typed

    [options] = t27_typed.SEEN
    assert (options["t27typed_max_wait"], options["t27typed_flag"], options["t27typed_verbose"]) == (
        9,
        "b",
        True,
    )
    # an append option's value is the list the command line makes of `--t27typed-tag 3 --t27typed-tag 4`
    assert options["t27typed_tag"] == [3, 4]


def test_a_plugin_whose_hooks_raise_leaves_the_others_options_and_stop_hooks(load_fake, caplog):
    """A plugin whose ``minisgl_add_cli_options`` raised dropped the options of every plugin after
    it ("unrecognized arguments: --callfmt-max-wait 5"), and one whose ``minisgl_process_stop``
    raised skipped every later plugin's stop hook (the docs say they are logged, never raised)."""
    import argparse
    import logging

    from minisgl_core.processes.child import ProcessContext
    from minisgl_core.server.cli import _add_plugin_args

    plugins = load_fake(
        {  # ("aaa" sorts first: its hooks run before the good plugin's)
            "minisgl-test-broken": (_thin("t20_broken", BROKEN_OPTIONS), {"aaa-t20broken": "t20_broken"}),
            "minisgl-test-good": (_thin("t21_good", GOOD_OPTIONS), {"t21good": "t21_good"}),
        }
    )
    parser = argparse.ArgumentParser()
    with caplog.at_level(logging.WARNING, logger="minisgl_core.server.cli"):
        _add_plugin_args(parser, plugins)
    assert parser.parse_args(["--t21good-max-wait", "5"]).t21good_max_wait == 5
    assert (
        "hook minisgl_add_cli_options raised RuntimeError: cli boom; its options are not available"
        in caplog.text
    )
    failures = plugins.call_hook("minisgl_process_stop", keep_going=True, ctx=ProcessContext(role="offline"))
    import t21_good

    assert t21_good.STOPPED == ["offline"]
    assert [str(f) for f in failures] == [
        "plugin 'aaa-t20broken' (minisgl-test-broken 0.1.0) hook minisgl_process_stop raised RuntimeError: stop boom"
    ]
    with pytest.raises(PluginError, match="stop boom"):  # (start hooks still stop at the first)
        plugins.call_hook("minisgl_process_stop", ctx=ProcessContext(role="offline"))
    # offline, the plugins' options reach ctx.options at their defaults, parsed as the command line
    # parses them (the docs' ctx.options["example_max_wait"] was a KeyError offline)
    assert plugins.option_defaults() == {"t21good_max_wait": 32}


def test_a_hook_that_raised_leaves_its_traceback_in_the_debug_log(load_fake, caplog):
    """A registration or process hook that raised was one line naming the plugin and the hook,
    and its traceback was nowhere, not even under ``--log-level debug`` (as an import failure's
    is): its author could not see which line of the plugin raised."""
    import logging
    import traceback

    from minisgl_core.processes.child import ProcessContext

    hooks = """
    @hookimpl
    def minisgl_register_caches(register):
        raise RuntimeError("register boom")
    """
    starting = """
    @hookimpl
    def minisgl_register_policies(register):
        register("t41-pol", "t41_start.impl:Fifo")

    @hookimpl
    def minisgl_process_start(ctx):
        raise RuntimeError("start boom")
    """
    with caplog.at_level(logging.DEBUG, logger="minisgl_core.plugins"):
        plugins = load_fake(
            {
                "minisgl-test-reg41": (_thin("t41_reg", hooks), {"t41reg": "t41_reg"}),
                "minisgl-test-start41": (_thin("t41_start", starting), {"t41start": "t41_start"}),
            }
        )
        with pytest.raises(PluginError, match="plugin 't41start' .* hook minisgl_process_start raised"):
            plugins.call_hook("minisgl_process_start", ctx=ProcessContext(role="offline"))

    def traceback_of(hook: str, plugin: str) -> str:
        [record] = [r for r in caplog.records if f"plugin {plugin!r}: hook {hook} raised" in r.getMessage()]
        assert record.levelno == logging.DEBUG and record.exc_info, record
        return "".join(traceback.format_exception(*record.exc_info))

    text = traceback_of("minisgl_register_caches", "t41reg")
    assert 't41_reg/__init__.py", line 6, in minisgl_register_caches' in text, text
    assert "RuntimeError: register boom" in text
    text = traceback_of("minisgl_process_start", "t41start")
    assert 't41_start/__init__.py", line 10, in minisgl_process_start' in text, text
    assert "RuntimeError: start boom" in text


ABSTRACT_HOOKS = """
@hookimpl
def minisgl_register_policies(register):
    register("t22-abstract", "t22_abstract.impl:Half")
"""
ABSTRACT_IMPL = """
from minisgl_core.api import SchedulingPolicy

class Half(SchedulingPolicy):
    def schedulee(self, state):  # (misspelt)
        return None
"""


def test_a_class_missing_an_abstract_method_fails_its_plugin_in_one_line(load_fake):
    """Listed as ok, it failed only when selected: a traceback naming no plugin (a tool parser:
    a 500 on every chat request with tools)."""
    modules = {**_thin("t22_abstract", ABSTRACT_HOOKS), "t22_abstract/impl.py": ABSTRACT_IMPL}
    plugins = load_fake({"minisgl-test-abstract": (modules, {"t22abstract": "t22_abstract"})})
    says = (
        "registered t22_abstract.impl:Half as --policy 't22-abstract', but it does not implement "
        "SchedulingPolicy's abstract method schedule: define it in Half (docs/plugins.md, SchedulingPolicy)"
    )
    with pytest.raises(PluginError) as raised:
        plugins.resolve("policies", "t22-abstract")
    assert str(raised.value) == f"plugin 't22abstract' (minisgl-test-abstract 0.1.0) {says}"
    plugins.check_classes()
    row = {row["name"]: row for row in plugins.listing()}["t22abstract"]
    assert row["status"] == "failed" and says in row["reason"]


HALF_MODEL_HOOKS = """
@hookimpl
def minisgl_register_models(register):
    register("T24HalfForCausalLM", "t24_halfmodel.impl:HalfModel")
"""
HALF_MODEL_IMPL = """
from minisgl_core.api import Model

class HalfModel(Model):
    def kv_spec(self):
        return None
"""


def test_a_model_missing_its_abstract_methods_fails_its_plugin(load_fake):
    """``Model`` is an ``nn.Module``, not an ABC, so a model class without ``forward`` and
    ``load_weights`` was listed ok and, selected, failed deep in the runner with a TypeError
    naming no plugin (a probe writing plugins from the docs)."""
    modules = {**_thin("t24_halfmodel", HALF_MODEL_HOOKS), "t24_halfmodel/impl.py": HALF_MODEL_IMPL}
    plugins = load_fake({"minisgl-test-halfmodel": (modules, {"t24halfmodel": "t24_halfmodel"})})
    with pytest.raises(
        PluginError,
        match=r"does not implement Model's abstract methods forward, load_weights: define them in HalfModel",
    ):
        plugins.resolve("models", "T24HalfForCausalLM")
    plugins.check_classes()
    assert {row["name"]: row for row in plugins.listing()}["t24halfmodel"]["status"] == "failed"


WRONG_INIT_IMPL = """
import minisgl_core.api as api


def needing_more(base):
    # its abstract methods defined: what is wrong is the constructor alone
    body = {
        name: lambda self, *args, **kwargs: None
        for name in dir(base)
        if getattr(getattr(base, name, None), "__isabstractmethod__", False)
    }

    def __init__(self, *args, extra, **kwargs):  # a keyword the core never passes
        pass

    body["__init__"] = __init__
    return type("NeedsMore", (base,), body)


for kind, base in BASES.items():
    globals()[kind] = needing_more(getattr(api, base))
"""


@pytest.mark.parametrize(
    ("kind", "call"),
    [
        ("models", "(config)"),
        ("attention", "(config)"),
        ("caches", "(page_size=...)"),
        ("policies", "()"),
        ("formats", "(path)"),
        ("grammars", "(tokenizer, vocab_size=..., stop_token_ids=...)"),
        ("tool_parsers", "(tools)"),
        ("reasoning_parsers", "()"),
        ("quantization", "(device=..., dtype=...)"),
    ],
)
def test_a_constructor_the_core_cannot_call_fails_its_plugin_in_one_line(load_fake, kind, call):
    """``__init__(self, rounds)`` on a policy (``policy_cls()``), ``(self, config, workspace_mb)``
    on an attention backend: a TypeError at the core's call, after the model had loaded, with no
    plugin named (the engine blames a plugin by its frames, and a bad call has none)."""
    from minisgl_core.plugins import KIND_BASES, KIND_HOOKS

    hooks = "".join(
        f"@hookimpl\ndef {hook}(register):\n    register('T25{k}', 't25_wronginit.impl:{k}')\n"
        for k, hook in KIND_HOOKS.items()
    )
    impl = f"BASES = {dict(KIND_BASES)!r}\n{WRONG_INIT_IMPL}"  # (KIND_BASES: every kind's API class)
    modules = {**_thin("t25_wronginit", hooks), "t25_wronginit/impl.py": impl}
    plugins = load_fake({"minisgl-test-wronginit": (modules, {"t25wronginit": "t25_wronginit"})})
    with pytest.raises(PluginError) as raised:
        plugins.resolve(kind, f"T25{kind}")
    message = str(raised.value)
    assert message.startswith(
        f"plugin 't25wronginit' (minisgl-test-wronginit 0.1.0) registered t25_wronginit.impl:{kind} as "
    ), message
    assert message.endswith(
        f", but the core builds it as NeedsMore{call} and its constructor takes NeedsMore(*args, extra, "
        "**kwargs) (missing a required argument: 'extra'): make NeedsMore.__init__ accept that call, "
        f"any other parameter with a default (docs/plugins.md, {KIND_BASES[kind]})"
    ), message
    plugins.check_classes()
    row = {row["name"]: row for row in plugins.listing()}["t25wronginit"]
    assert row["status"] == "failed" and f"builds it as NeedsMore{call}" in row["reason"]


def test_entry_point_mistakes_are_named_in_one_line(load_fake):
    """``name = "module:attr"`` with an attribute that exists said "declares no MINISGL_API" (the
    module declares it); two entry points naming one module failed with pluggy's 5,000-character
    list of every registered plugin."""
    hooks = '@hookimpl\ndef minisgl_register_policies(register):\n    register("t23-pol", "t23_twice.impl:Fifo")\n'
    thin = _thin("t23_twice", hooks)
    thin["t23_twice/__init__.py"] += "\nhooks = object()\n"
    plugins = load_fake(
        {
            "minisgl-test-twice": (
                thin,
                {"t23a": "t23_twice", "t23b": "t23_twice", "t23c": "t23_twice:hooks"},
            ),
        }
    )
    rows = {row["name"]: row for row in plugins.listing()}
    assert rows["t23a"]["status"] == "ok"
    assert rows["t23b"]["status"] == "failed"
    assert rows["t23b"]["reason"] == (
        "its entry point names module 't23_twice', as plugin 't23a''s does (minisgl-test-twice): a "
        "module is one plugin; keep one of the two entry points"
    )
    assert rows["t23c"]["status"] == "failed"
    assert rows["t23c"]["reason"] == (
        "the entry point's value must be the thin module itself, t23c = 't23_twice', not "
        "'t23_twice:hooks' (which names object 'hooks' in it)"
    )


def test_a_plugin_that_exits_on_import_is_failed_not_the_end_of_the_process(install_plugin_module):
    """``import sys; sys.exit(0)`` in a plugin's module ended ``plugins --check`` (and ``serve``)
    silently with status 0 (a probe's find): SystemExit went past the loader's ``except Exception``."""
    install_plugin_module("minisgl_quitter", "minisgl-quitter", "import sys\nsys.exit(0)\n")
    plugins = Plugins.load(deprecation_warnings=False)
    [info] = [i for i in plugins.infos if i.name == "quitter"]
    assert (info.status, info.reason) == ("failed", "import failed: SystemExit: 0")
    assert any(i.name == "torch" and i.status == "ok" for i in plugins.infos)  # the others loaded

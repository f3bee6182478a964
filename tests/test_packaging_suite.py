"""The packaging conformance suite must fail badly packaged plugins: one installed distribution
carries a broken thin module per entry point, and the suite test named next to each must fail on
it (the first-party plugins' own packaging tests are the passing control)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from minisgl_core.testing.packaging_suite import PluginPackagingSuite

API = 'from minisgl_core.api import hookimpl\nMINISGL_API = "2.0"\n'
REGISTER = '@hookimpl\ndef minisgl_register_policies(register):\n    register("{name}", "minisgl_test_broken.impl:Policy")\n'
MODULES = {
    "heavy": API
    + "import minisgl_core.engine.engine  # the engine, not the API\n"
    + REGISTER.format(name="heavy"),
    "unmarked": API + "def minisgl_register_policies(register):\n    register('unmarked', 'x:y')\n",
    "typo": API + "@hookimpl\ndef minisgl_register_policy(register):\n    register('typo', 'x:y')\n",
    "badtarget": API + "@hookimpl\ndef minisgl_register_policies(register):\n"
    "    register('badtarget', 'minisgl_test_broken.impl:NotAPolicy')\n",
    "noapi": "from minisgl_core.api import hookimpl\n" + REGISTER.format(name="noapi"),
    "futureapi": API.replace("2.0", "2.99") + REGISTER.format(name="futureapi"),
    "flaky": API
    + "import itertools\n_count = itertools.count()\n@hookimpl\ndef minisgl_register_policies(register):\n"
    "    register(f'flaky-{next(_count)}', 'minisgl_test_broken.impl:Policy')\n",
    "cli": API + REGISTER.format(name="cli") + "@hookimpl\ndef minisgl_add_cli_options(parser):\n"
    "    parser.add_argument('--max-wait', type=int)\n",
    # returns its registrations instead of calling register: the core registered nothing
    "retdict": API + "@hookimpl\ndef minisgl_register_policies(register):\n"
    "    return {'retdict': 'minisgl_test_broken.impl:Policy'}\n",
    # registers the name of the prefill-first plugin's policy: selecting it would be an error
    "collide": API + REGISTER.format(name="prefill-first"),
    # imports PyYAML, which the distribution does not declare
    "impl": "import yaml  # noqa: F401\nimport jinja2  # noqa: F401\nfrom minisgl_core.api import SchedulingPolicy\n"
    "class Policy(SchedulingPolicy):\n    def schedule(self, state):\n        return None\n"
    "class NotAPolicy:\n    pass\n",
}
MUTANTS = [
    ("heavy", "test_entry_module_imports_cheaply", "minisgl_core.engine"),
    ("unmarked", "test_hooks_are_known_and_marked", "lacks @hookimpl"),
    ("typo", "test_hooks_are_known_and_marked", "not a minisgl hook"),
    ("badtarget", "test_registered_targets_resolve", "not a SchedulingPolicy subclass"),
    ("noapi", "test_declares_compatible_api", "MINISGL_API must be"),
    ("futureapi", "test_declares_compatible_api", "not compatible"),
    ("flaky", "test_registration_is_idempotent", "twice registered different things"),
    ("cli", "test_cli_options_are_namespaced", "must start with --cli-"),
    ("retdict", "test_registration_is_idempotent", "returned a dict; call register"),
    ("retdict", "test_loaded_by_the_core", "says failed: minisgl_register_policies returned a dict"),
    # every undeclared import named at once, not the first of each run
    (
        "heavy",
        "test_imports_are_declared_dependencies",
        "imports 'jinja2' .*imports 'yaml'|imports 'yaml' .*imports 'jinja2'",
    ),
    (
        "collide",
        "test_names_are_its_own",
        "'prefill-first' .* is registered by minisgl-plugin-prefill-first too",
    ),
    ("heavy", "test_names_are_its_own", None),  # the control
    ("heavy", "test_registration_is_idempotent", None),  # the control: this one is fine
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("broken") / "src"
    (src / "minisgl_test_broken").mkdir(parents=True)
    (src / "minisgl_test_broken" / "__init__.py").write_text("")
    for name, code in MODULES.items():
        (src / "minisgl_test_broken" / f"{name}.py").write_text(code)
    entry_points = "\n".join(f'{name} = "minisgl_test_broken.{name}"' for name in MODULES if name != "impl")
    (src / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "minisgl-test-broken"
        version = "0.1.0"
        dependencies = ["minisgl-core>=0.1"]
        [tool.setuptools]
        packages = ["minisgl_test_broken"]
        [project.entry-points."minisgl.plugins"]
    """)
        + entry_points
        + "\n"
    )
    target = src.parent / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True)  # fmt: skip
    return target


@pytest.mark.parametrize(
    ("plugin", "test_name", "message"), MUTANTS, ids=[f"{m[0]}-{m[1][5:]}" for m in MUTANTS]
)
def test_suite_catches(
    site: Path, monkeypatch: pytest.MonkeyPatch, plugin: str, test_name: str, message: str | None
) -> None:
    monkeypatch.syspath_prepend(str(site))

    class Suite(PluginPackagingSuite):
        distribution = "minisgl-test-broken"

    Suite.plugin = plugin
    test = getattr(Suite(), test_name)
    if message is None:
        test()
    else:
        with pytest.raises(AssertionError, match=message):
            test()


def test_a_wrong_provides_says_what_was_registered(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``provides = {"policy": [...]}`` (the kind is "policies") failed with a bare AssertionError:
    the suites are installed modules, which pytest does not rewrite unless told to."""
    monkeypatch.syspath_prepend(str(site))

    class Suite(PluginPackagingSuite):
        distribution = "minisgl-test-broken"
        plugin = "heavy"
        provides = {"policy": ["heavy"]}

    with pytest.raises(
        AssertionError, match=r"registered \{'policies': \['heavy'\]\}, where provides = \{'policy'"
    ):
        Suite().test_registration_is_idempotent()

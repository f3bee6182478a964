"""docs/plugins.md documents the whole plugin API, and every hook has a test (datasette's rule).

Undocumented or untested parts of the API fail here: every public name of ``minisgl_core.api``
and ``minisgl_core.layers``, every hook with its exact signature, every method of the four
extension classes with its exact signature, and the template plugin's code as it really is.
Beside it, facts the other docs state that a test can hold: every flag they name exists.
"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

import minisgl_core.api as api
from minisgl_core import layers
from minisgl_core.api import (
    AttentionBackend,
    CacheManager,
    GrammarBackend,
    GrammarMatcher,
    Model,
    QuantizationMethod,
    SchedulingPolicy,
    hookspecs,
)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
TEMPLATE_FILES = [
    "pyproject.toml",
    "minisgl_plugin_example/__init__.py",
    "minisgl_plugin_example/attention.py",
    "minisgl_plugin_example/policy.py",
    "tests/test_example.py",
]
HOOKS = {
    name: fn for name, fn in vars(hookspecs).items() if name.startswith("minisgl_") and inspect.isfunction(fn)
}


def doc_text() -> str:
    return DOC.read_text()


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _annotation(annotation: object) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def signature_line(name: str, fn: object) -> str:
    """``def name(a: T, *, b: U = 1) -> R`` with annotations as written in the source."""
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    parts: list[str] = []
    for param in sig.parameters.values():
        if param.kind is param.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        text = param.name + (f": {_annotation(param.annotation)}" if _annotation(param.annotation) else "")
        parts.append(text + (f" = {param.default!r}" if param.default is not param.empty else ""))
    returns = _annotation(sig.return_annotation)
    return f"def {name}({', '.join(parts)})" + (f" -> {returns}" if returns else "")


def extension_methods() -> list[tuple[str, str]]:
    """(class name, signature line) of every public method the extension classes define."""
    out = []
    for cls in (
        AttentionBackend,
        CacheManager,
        Model,
        SchedulingPolicy,
        GrammarBackend,
        GrammarMatcher,
        QuantizationMethod,
    ):
        for name, raw in vars(cls).items():
            if name.startswith("_") and name != "__init__":
                continue
            fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else getattr(raw, "fget", raw)
            if inspect.isfunction(fn):
                out.append((cls.__name__, signature_line(name, fn)))
    return out


@pytest.mark.parametrize("name", sorted(set(api.__all__) | set(layers.__all__)))
def test_public_api_name_is_documented(name: str) -> None:
    assert re.search(rf"`[^`]*\b{re.escape(name)}\b", doc_text()), (
        f"{name} is not mentioned in docs/plugins.md"
    )


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hook_is_documented_with_its_signature(hook: str) -> None:
    text = doc_text()
    assert f"### {hook}\n" in text, f"docs/plugins.md has no section '### {hook}'"
    line = signature_line(hook, HOOKS[hook])
    assert squash(line) in squash(text), f"docs/plugins.md lacks the exact signature:\n    {line}"


@pytest.mark.parametrize(
    ("cls", "line"), extension_methods(), ids=lambda v: v if "(" not in v else v[4 : v.index("(")]
)
def test_extension_method_is_documented_with_its_signature(cls: str, line: str) -> None:
    section = "GrammarBackend" if cls == "GrammarMatcher" else cls  # documented together
    assert f"### {section}\n" in doc_text(), f"docs/plugins.md has no section '### {section}'"
    assert squash(line) in squash(doc_text()), f"docs/plugins.md lacks {cls}'s exact signature:\n    {line}"


@pytest.mark.parametrize("hook", sorted(HOOKS))
def test_hook_is_exercised_by_a_test(hook: str) -> None:
    files = [
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("plugins/*/*/tests/**/*.py"),
        *ROOT.glob("templates/plugin/tests/**/*.py"),
    ]
    users = [f for f in files if f.name != Path(__file__).name and hook in f.read_text()]
    assert users, f"no test mentions {hook}: add one that makes the core call it"


@pytest.mark.parametrize("path", TEMPLATE_FILES)
def test_template_code_in_the_docs_is_the_template(path: str) -> None:
    source = (ROOT / "templates" / "plugin" / path).read_text().rstrip("\n")
    assert source in doc_text(), f"docs/plugins.md must show templates/plugin/{path} exactly as it is"


def test_signature_line_renders_keyword_only_and_defaults() -> None:
    """The helper the checks above rely on: a mismatch here would make them vacuous or wrong."""

    def sample(a: int, *, b: str = "x") -> None: ...

    assert signature_line("sample", sample) == "def sample(a: int, *, b: str = 'x') -> None"
    assert (
        signature_line("__init__", CacheManager.__init__) == "def __init__(self, *, page_size: int) -> None"
    )


def test_plugin_page_says_what_the_code_does() -> None:
    """Facts the page once got wrong: the template's API version in "Try it" (said 1.1), the
    kinds ``names(kind)`` takes (four of nine), a row per registration hook in "How the core uses
    a plugin" (formats and grammars were missing), the layers' module outside the migration
    section (``minisgl_core.api.layers``, moved in 2.0), and where ``Register`` lives."""
    from minisgl_core.plugins import KIND_HOOKS, KINDS

    text = doc_text()
    template = (ROOT / "templates" / "plugin" / "minisgl_plugin_example" / "__init__.py").read_text()
    api_version = re.search(r'^MINISGL_API = "([\d.]+)"', template, re.M).group(1)
    try_it = next(line for line in text.splitlines() if line.startswith("minisgl plugins "))
    assert f" {api_version}  ok " in try_it, try_it
    names_sentence = squash(text[text.index("whose `names(kind)`") :][:400])
    assert all(f'`"{kind}"`' in names_sentence for kind in KINDS), names_sentence
    table = text[text.index("## How the core uses a plugin") : text.index("1. **Discovery.**")]
    assert all(f"| `{hook}` |" in table for hook in KIND_HOOKS.values())
    before_migration = text[: text.index("## Migrating from 1.x")]
    assert "minisgl_core.api.layers" not in before_migration
    assert "`minisgl_core.api.hookspecs.Register`" in text


def test_every_tool_is_named_in_the_tools_readme() -> None:
    """README.md says tools/README.md lists the tools; fifteen of them had gone unlisted."""
    readme = (ROOT / "tools" / "README.md").read_text(encoding="utf-8")
    import subprocess

    # the tracked files only (a checkout's untracked output there is not a tool)
    listed = subprocess.run(
        ["git", "ls-files", "tools"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    tools = sorted(
        {Path(line).relative_to("tools").parts[0] for line in listed.stdout.split()} - {"README.md"}
    )
    assert len(tools) > 60
    assert [name for name in tools if f"`{name}" not in readme] == []


def test_the_kit_capability_list_names_each_suite_s_known_capabilities() -> None:
    """The page's "Capabilities:" paragraph had left out the attention suite's `kv_fp8`."""
    from minisgl_core.testing import attention_suite, model_suite, policy_suite

    text = DOC.read_text(encoding="utf-8")
    paragraph = text[text.index("\nCapabilities: attention ") :].split("\n\n")[0]
    parts = {
        "attention": paragraph[paragraph.index("attention ") : paragraph.index("(on the backend class)")],
        "policy": paragraph[paragraph.index("policy `") : paragraph.index("(on the\npolicy class")],
        "model": paragraph[paragraph.index("model `") : paragraph.index("(on the suite); weight")],
    }
    known = {
        "attention": attention_suite.KNOWN_CAPABILITIES,
        "policy": policy_suite.KNOWN_CAPABILITIES,
        "model": model_suite.KNOWN_CAPABILITIES,
    }
    for kind, part in parts.items():
        assert set(re.findall(r"`([^`]+)`", part)) == set(known[kind]), (kind, part)


#: flags the docs name that are other programs' own, not minisgl's
FOREIGN_FLAGS = {
    "--scheduling-policy": "vLLM's, which --policy priority matches",
    "--worker-urls": "the SGLang Model Gateway's (python -m sglang_router.launch_router)",
    "--wheel": "python -m build's",
    "--no-deps": "pip's",
    "--target": "pip install's",
    "--sweep": "tools/device_fp8_check.py's",
    "--example-max-wait": "the option plugins.md's example plugin adds",
    "--aging-max-wait": "the option of plugins.md's example of a policy built with ctx (API 2.9)",
    "--file-durations": "pytest's, added by the tree's conftest.py (make test, CI)",
}


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands, at any depth."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def test_every_flag_the_docs_name_is_a_flag_of_the_command_line() -> None:
    """A flag renamed or removed in the CLI left behind in the README, the docs or a plugin's
    README is a command that fails as written; each flag named there is one of `minisgl`'s
    (any subcommand) or another program's, listed in FOREIGN_FLAGS."""
    from minisgl_core.cli import build_parser

    known = _option_strings(build_parser()) | set(FOREIGN_FLAGS)
    docs = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted(ROOT.glob("plugins/*/*/README.md")),
    ]
    unknown = [
        f"{doc.relative_to(ROOT)}: {flag}"
        for doc in docs
        for flag in sorted(
            set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", doc.read_text(encoding="utf-8")))
        )
        if flag not in known
    ]
    assert unknown == []


def test_the_hermes_example_is_the_hermes_plugin_s_parser() -> None:
    """The page shows HermesToolParser as a format needing no code; it had left out the plugin's
    `arguments_keys`, so a parser copied from it missed calls written with "parameters"."""
    source = (ROOT / "plugins" / "parsers" / "hermes" / "minisgl_plugin_hermes" / "parser.py").read_text()
    code = source[source.index("class HermesToolParser(") :].splitlines()
    parser = "\n".join(line for line in code if line.strip() and not line.strip().startswith("#"))
    assert parser in doc_text()


def test_the_readme_plugin_table_names_what_each_first_party_plugin_registers() -> None:
    """README's Plugins table is where a user learns what `--attn`, `--policy`, `--quantization`,
    the parsers and `architectures` take: a plugin added to plugins/ (or a name added to one)
    without a mention there is a choice nobody is told about."""
    from minisgl_core.plugins import Plugins

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[
        readme.index("| kind | plugins (distribution") : readme.index("Plugins are discovered through")
    ]
    first_party = {path.parent.name for path in ROOT.glob("plugins/*/*/pyproject.toml")}
    infos = [info for info in Plugins.load().infos if info.name in first_party]
    assert {info.name for info in infos} == first_party
    missing = [
        f"{info.name}: {name}"
        for info in infos
        for names in info.provides.values()
        for name in [info.name, *names]
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", table)
    ]
    assert missing == []


def test_the_recipe_for_a_plugin_without_installing_it_works(tmp_path: Path) -> None:
    """The page said only ``pip install -e``: a plugin author who may not install into minisgl's
    environment had to find out from the core's tests that a hand-written ``.dist-info`` folder on
    ``PYTHONPATH`` is discovered. The recipe's shell lines, run as written on a copy of the
    template, then its ``minisgl plugins`` line in the environment they leave, list the plugin ok
    with what it registers (its ``minisgl serve`` line is not run here)."""
    import os
    import shlex
    import shutil
    import subprocess

    from minisgl_core.testing.cli_runner import run_cli

    text = doc_text()
    section = text[text.index("### Without installing it") :]
    start = section.index("```bash\n") + len("```bash\n")
    lines = section[start : section.index("\n```", start)].splitlines()
    shell = "\n".join(line for line in lines if not line.startswith("minisgl "))
    [listing] = [line.split("#")[0].split()[1:] for line in lines if line.startswith("minisgl plugins")]
    plugin = tmp_path / "minisgl-plugin-example"
    shutil.copytree(ROOT / "templates" / "plugin", plugin)
    env = {k: v for k, v in os.environ.items() if k not in ("MINISGL_PLUGINS", "MINISGL_DISABLE_PLUGINS")}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'{shell}\nprintf %s "$PYTHONPATH"'],
        cwd=plugin, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(os.pathsep)[0] == str(plugin), shlex.quote(done.stdout)
    listed = run_cli(listing, env={**env, "PYTHONPATH": done.stdout}, cwd=plugin)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if line.startswith("example ")]
    assert row.split()[1:5] == ["minisgl-plugin-example", "0.1.0", "2.5", "ok"], row
    assert row.endswith("attention: example; policies: shortest-first"), row


def test_every_testing_name_the_template_imports_is_documented_in_the_kit_section() -> None:
    """The template's test imports ``TransformersReference`` from ``minisgl_core.testing.reference``,
    which the page showed inside the template and nowhere said what it is or returns: a plugin
    author copying the test had to read the core's source. Each name the template's tests import
    from ``minisgl_core.testing`` is explained in "The conformance kit" (or "Publishing")."""
    import ast

    source = (ROOT / "templates" / "plugin" / "tests" / "test_example.py").read_text()
    imported = [
        (node.module, alias.name)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minisgl_core.testing")
        for alias in node.names
    ]
    assert ("minisgl_core.testing.reference", "TransformersReference") in imported
    text = doc_text()
    kit = text[text.index("## The conformance kit") :]
    missing = [f"{module}.{name}" for module, name in imported if f"`{module}" not in kit or name not in kit]
    assert missing == [], f"docs/plugins.md's kit section does not explain {missing}"

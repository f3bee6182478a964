"""Conformance suite for how a plugin is packaged: subclass it with the installed plugin's name.

    from minisgl_core.testing.packaging_suite import PluginPackagingSuite

    class TestMyPluginPackaging(PluginPackagingSuite):
        plugin = "mine"                          # the entry-point name
        provides = {"attention": ["mine"]}       # what it must register, per kind

It checks the installed distribution (editable or not), the way the core sees it: the entry point
in its metadata, a dependency on minisgl-core and on every other distribution its code imports,
an entry module that imports nothing but the standard library and ``minisgl_core.api`` (checked
in a fresh interpreter: no kernel library, no CUDA initialisation), a compatible ``MINISGL_API``,
only known hooks, registration that is idempotent and names ``"module:attr"`` targets that import
and subclass the right ABC, the core's loader marking it ``ok``, and its plugin name and the names
it registers not taken by another installed distribution. Optional hooks (CLI options,
process start/stop) are checked when the plugin implements them and skipped otherwise.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest

from minisgl_core.api import (
    AttentionBackend,
    CacheManager,
    GrammarBackend,
    Model,
    ProcessContext,
    QuantizationMethod,
    ReasoningParser,
    SchedulingPolicy,
    ToolParser,
    WeightFormat,
    hookspecs,
)
from minisgl_core.plugins import GROUP, KIND_HOOKS, PluginInfo, Plugins, api_compatible

KIND_BASES: dict[str, type] = {
    "models": Model,
    "attention": AttentionBackend,
    "caches": CacheManager,
    "policies": SchedulingPolicy,
    "formats": WeightFormat,
    "tool_parsers": ToolParser,
    "reasoning_parsers": ReasoningParser,
    "grammars": GrammarBackend,
    "quantization": QuantizationMethod,
}
HOOK_NAMES = frozenset(name for name in dir(hookspecs) if name.startswith("minisgl_"))
#: what a discovery-time import must never pull in: kernel libraries and compilers
HEAVY_MODULES = (
    "flashinfer",
    "flash_attn",
    "flash_attn_interface",
    "triton",
    "xformers",
    "vllm",
    "sgl_kernel",
    "deep_gemm",
    "cutlass",
    "cuda",
    "tensorrt",
    "xgrammar",
    "llguidance",
)
#: import name -> distribution for common heavy dependencies that need not be installed here
KNOWN_DISTRIBUTIONS = {
    "flashinfer": "flashinfer-python",
    "flash_attn": "flash-attn",
    "flash_attn_interface": "flash-attn",
    "triton": "triton",
    "xformers": "xformers",
    "sgl_kernel": "sgl-kernel",
    "deep_gemm": "deep-gemm",
    "xgrammar": "xgrammar",
    "llguidance": "llguidance",
}

_PROBE = """
import json, sys
import minisgl_core.api  # shared by every plugin, so not the plugin's cost
before = set(sys.modules)
import {module}
torch = sys.modules.get("torch")
print(json.dumps({{"new": sorted(set(sys.modules) - before),
                  "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized())}}))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical distribution name of a ``Requires-Dist`` line (``"torch>=2.4; extra == 'x'"`` -> torch)."""
    return canonical(re.match(r"\s*[A-Za-z0-9._-]+", requirement).group(0).strip())  # type: ignore[union-attr]


def requirement_names(dist: metadata.Distribution) -> set[str]:
    """Canonical names of every ``Requires-Dist`` (extras included)."""
    return {requirement_name(req) for req in dist.requires or []}


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def providers_of(top_level: str, known: dict[str, str] = KNOWN_DISTRIBUTIONS) -> list[str]:
    """Distributions that provide import name ``top_level``: installed ones, else ``known``'s guess."""
    return _packages_distributions().get(top_level) or ([known[top_level]] if top_level in known else [])


def imported_top_levels(package: Path) -> dict[str, str]:
    """Top-level module of every absolute import in the package's source -> a file that imports it."""
    files = sorted(package.rglob("*.py")) if package.is_dir() else [package]
    found: dict[str, str] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.partition(".")[0], path.name)
    return found


class PluginPackagingSuite:
    #: the entry-point name in the ``minisgl.plugins`` group
    plugin: ClassVar[str] = ""
    #: the distribution that must provide it (default ``minisgl-plugin-<plugin>``)
    distribution: ClassVar[str | None] = None
    #: kind ("models", "attention", "caches", "policies", "formats") -> names it must register; None: not checked
    provides: ClassVar[dict[str, list[str]] | None] = None
    heavy_modules: ClassVar[tuple[str, ...]] = HEAVY_MODULES
    known_distributions: ClassVar[dict[str, str]] = KNOWN_DISTRIBUTIONS

    # --- plumbing ---

    def dist(self) -> metadata.Distribution:
        name = self.distribution or f"minisgl-plugin-{self.plugin}"
        try:
            return metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(
                f"distribution {name!r} is not installed (pip install -e . in the plugin's directory)"
            )

    def entry_point(self) -> metadata.EntryPoint:
        if not self.plugin:
            raise TypeError(f"{type(self).__name__} must set plugin")
        eps = [ep for ep in self.dist().entry_points if ep.group == GROUP and ep.name == self.plugin]
        assert eps, f"{self.dist().metadata['Name']} declares no {GROUP!r} entry point named {self.plugin!r}"
        return eps[0]

    def module(self) -> ModuleType:
        return self.entry_point().load()

    def registrations(self) -> dict[str, list[tuple[str, str]]]:
        """kind -> (name, target) pairs, from calling the module's registration hooks directly."""
        module = self.module()
        out: dict[str, list[tuple[str, str]]] = {}
        for kind, hook in KIND_HOOKS.items():
            if hasattr(module, hook):
                calls: list[tuple[str, str]] = []
                returned = getattr(module, hook)(
                    register=lambda name, target, _calls=calls: _calls.append((name, target))
                )
                # (the core's loader fails the plugin: what is returned is never registered)
                assert returned is None, (
                    f"{hook} returned a {type(returned).__name__}; call register(name, target) instead"
                )
                out[kind] = calls
        return out

    # --- the tests ---

    def test_entry_point_names_a_module(self) -> None:
        value = self.entry_point().value
        assert re.fullmatch(r"[A-Za-z_][\w.]*", value), (
            f"entry point {self.plugin} = {value!r}: name the thin module itself (no ':attr')"
        )

    def test_distribution_requires_minisgl_core(self) -> None:
        assert "minisgl-core" in requirement_names(self.dist()), "add minisgl-core to [project] dependencies"

    def test_entry_module_imports_cheaply(self) -> None:
        module = self.entry_point().value
        # The fresh interpreter sees what this one does (plugins installed in a --target directory too).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE.format(module=module)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert probe.returncode == 0, f"importing {module} failed:\n{probe.stderr[-2000:]}"
        report = json.loads(probe.stdout.strip().splitlines()[-1])
        assert not report["cuda_initialized"], f"importing {module} initialised CUDA"
        own = module.partition(".")[0]
        # named by top-level package: torch pulls in numpy, whose modules sort first
        heavy = sorted({m.partition(".")[0] for m in report["new"]} & set(self.heavy_modules))
        assert not heavy, f"importing {module} imports kernel libraries {heavy}: import them lazily"
        allowed = set(sys.stdlib_module_names) | {own}
        extra = [
            m
            for m in report["new"]
            if m.partition(".")[0] not in allowed and not m.startswith(("minisgl_core.api", "__"))
        ]
        # named by package (two levels), so the culprit shows even when it pulls in many modules
        packages = sorted({".".join(m.split(".")[:2]) for m in extra})
        assert not extra, (
            f"the entry module {module} imports {packages[:8]}: keep it to the standard library and "
            f"minisgl_core.api, and name the real classes lazily as 'module:attr'"
        )

    def test_declares_compatible_api(self) -> None:
        api = getattr(self.module(), "MINISGL_API", None)
        assert isinstance(api, str) and re.fullmatch(r"\d+\.\d+", api), (
            f"MINISGL_API must be 'major.minor', got {api!r}"
        )
        assert api_compatible(api), f"MINISGL_API {api} is not compatible with this core"

    def test_hooks_are_known_and_marked(self) -> None:
        module = self.module()
        marker = f"{hookspecs.PROJECT}_impl"
        for name in dir(module):
            obj = getattr(module, name)
            if name.startswith("minisgl_") and callable(obj):
                assert name in HOOK_NAMES, f"{name} is not a minisgl hook; known: {sorted(HOOK_NAMES)}"
                assert hasattr(obj, marker), f"{name} lacks @hookimpl, so the core never calls it"

    def test_registration_is_idempotent(self) -> None:
        first, second = self.registrations(), self.registrations()
        assert first, "the plugin implements no registration hook"
        assert first == second, "calling the registration hooks twice registered different things"
        for kind, calls in first.items():
            names = [name for name, _ in calls]
            assert len(set(names)) == len(names), f"{kind}: a name is registered twice: {names}"
        if self.provides is not None:
            got = {kind: sorted(n for n, _ in calls) for kind, calls in first.items() if calls}
            wanted = {k: sorted(v) for k, v in self.provides.items()}
            assert got == wanted, (
                f"the registration hooks registered {got}, where provides = {wanted} (kinds are "
                f"{', '.join(sorted(KIND_BASES))})"
            )

    def test_registered_targets_resolve(self) -> None:
        import torch

        for kind, calls in self.registrations().items():
            for name, target in calls:
                assert re.fullmatch(r"[\w.]+:[\w.]+", target), (
                    f"{kind} {name!r}: target {target!r} is not 'module:attr'"
                )
                module, _, attr = target.partition(":")
                obj = importlib.import_module(module)
                for part in attr.split("."):
                    obj = getattr(obj, part)
                assert isinstance(obj, type) and issubclass(obj, KIND_BASES[kind]), (
                    f"{kind} {name!r} -> {target} is not a {KIND_BASES[kind].__name__} subclass"
                )
                if kind in ("attention", "grammars"):
                    reason = (
                        obj.availability(torch.device("cpu")) if kind == "attention" else obj.availability()
                    )
                    assert reason is None or (isinstance(reason, str) and reason), (
                        "availability() must be None or a reason"
                    )

    def test_loaded_by_the_core(self) -> None:
        info = next(i for i in Plugins.load(allow=[self.plugin]).infos if i.name == self.plugin)
        assert info.status == "ok", f"the core's loader says {info.status}: {info.reason}"
        assert canonical(info.distribution) == canonical(self.dist().metadata["Name"])
        expected = {kind: sorted(n for n, _ in calls) for kind, calls in self.registrations().items()}
        assert {k: sorted(v) for k, v in info.provides.items() if v} == {
            k: v for k, v in expected.items() if v
        }

    def test_names_are_its_own(self) -> None:
        """No other installed distribution has this plugin's name or registers a name it registers:
        the core would load neither plugin of a shared plugin name, and refuse a shared registered
        name when selected (docs/plugins.md, "Name collisions")."""
        mine = canonical(self.dist().metadata["Name"])
        plugins = Plugins.load()
        taken = [i for i in plugins.infos if i.name == self.plugin and canonical(i.distribution) != mine]
        assert not taken, (
            f"plugin name {self.plugin!r} is also the entry point of {taken[0].distribution}: "
            "pick a name no other plugin has"
        )

        def this(info: PluginInfo) -> bool:
            return info.name == self.plugin and canonical(info.distribution) == mine

        shared = [
            f"{name!r} ({KIND_HOOKS[kind]}) is registered by "
            + " and ".join(r.plugin.distribution for r in regs if not this(r.plugin))
            + " too"
            for (kind, name), regs in sorted(plugins.collisions.items())
            if any(this(r.plugin) for r in regs)
        ]
        assert not shared, f"{'; '.join(shared)}: register under names no other plugin uses"

    def test_imports_are_declared_dependencies(self) -> None:
        own = self.module().__name__.partition(".")[0]
        package = importlib.import_module(own)  # the whole top-level package, not just the entry module
        source = Path(package.__file__).parent if hasattr(package, "__path__") else Path(package.__file__)
        declared = requirement_names(self.dist())
        undeclared = []  # every one at once, not the first of each run
        for top, where in imported_top_levels(source).items():
            if top in sys.stdlib_module_names or top == own or top == "__future__":
                continue
            providers = providers_of(top, self.known_distributions)
            if not any(canonical(p) in declared for p in providers):
                undeclared.append(
                    f"{where} imports {top!r} (distribution {providers[0] if providers else '?'})"
                )
        assert not undeclared, (
            f"{'; '.join(undeclared)}, which the distribution does not declare in [project] "
            f"dependencies; declared: {sorted(declared)}"
        )

    def test_cli_options_are_namespaced(self) -> None:
        hook = getattr(self.module(), "minisgl_add_cli_options", None)
        if hook is None:
            pytest.skip("the plugin adds no CLI options")
        parser = argparse.ArgumentParser()
        known = {opt for action in parser._actions for opt in action.option_strings}
        hook(parser=parser)
        added = {opt for action in parser._actions for opt in action.option_strings} - known
        assert added, "minisgl_add_cli_options added no option"
        prefix = f"--{self.plugin}-"
        assert all(opt.startswith(prefix) for opt in added), (
            f"options {sorted(added)} must start with {prefix}"
        )

    def test_process_hooks_run(self) -> None:
        module = self.module()
        hooks = [
            getattr(module, h)
            for h in ("minisgl_process_start", "minisgl_process_stop")
            if hasattr(module, h)
        ]
        if not hooks:
            pytest.skip("the plugin implements no process hooks")
        from minisgl_core.testing.targets import suite_context

        # (as a process gives it: the plugins' options at their defaults, resolve that works)
        scheduler = suite_context()
        for role in ("offline", "scheduler"):
            ctx = ProcessContext(role=role, options=scheduler.options, _plugins=scheduler._plugins)
            for hook in hooks:
                hook(ctx=ctx)

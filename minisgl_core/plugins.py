"""Plugin discovery, per-plugin status, the registries (one per kind) and the cross-process fingerprint.

Plugins are modules named by entry points in the ``minisgl.plugins`` group. Each one is loaded,
version-checked and asked to register its implementations one at a time inside try/except, so a
broken plugin is recorded as ``failed`` with its reason and never stops the others. It only
becomes fatal when the user selects something it provides (see :meth:`Plugins.resolve`).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import inspect
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pluggy
from packaging.version import Version

from minisgl_core import environment
from minisgl_core.api import API_VERSION, hookspecs
from minisgl_core.setting_names import Spelling, given, named

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: names in the environment's plugin lists that no installed plugin has, already warned about
_WARNED_UNKNOWN: set[str] = set()
#: plugins whose failure to load this process has logged (see Plugins.report_unloaded)
_WARNED_UNLOADED: set[str] = set()
#: distributions whose metadata was found twice, differing, already warned about (_warn_shadowed)
_WARNED_SHADOWED: set[str] = set()
#: the statuses of a plugin that did not load for a fault of its own
NOT_LOADED = ("failed", "incompatible", "conflict")

GROUP = "minisgl.plugins"
#: what a registered name may be: a flag's value (``--attn a,b`` lists two; spaces split words)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
KINDS = (
    "models",
    "attention",
    "caches",
    "policies",
    "formats",
    "grammars",
    "tool_parsers",
    "reasoning_parsers",
    "quantization",
)
KIND_HOOKS = {
    "models": "minisgl_register_models",
    "attention": "minisgl_register_attention_backends",
    "caches": "minisgl_register_caches",
    "policies": "minisgl_register_policies",
    "formats": "minisgl_register_weight_formats",
    "tool_parsers": "minisgl_register_tool_parsers",
    "reasoning_parsers": "minisgl_register_reasoning_parsers",
    "grammars": "minisgl_register_grammar_backends",
    "quantization": "minisgl_register_quantization_methods",
}
# What users select each kind with, as messages name it: an engine setting (its flag or its
# keyword, see setting_names), or a noun for what config.json or the model's files select.
KIND_SETTINGS = {
    "attention": "attn",
    "caches": "cache",
    "policies": "policy",
    "tool_parsers": "tool_call_parser",
    "reasoning_parsers": "reasoning_parser",
    "grammars": "grammar_backend",
    "quantization": "quantization",
}
KIND_NOUNS = {"models": "model architecture", "formats": "weight format"}


def selection(kind: str, name: str | None = None, spelling: Spelling = "flag", *, quote: bool = True) -> str:
    """What the user selected, as a message says it: ``--attn 'fi'`` (``attn='fi'`` as a Python
    keyword), ``model architecture 'X'``; ``name`` None: the setting alone (``--attn``)."""
    if kind in KIND_NOUNS:
        noun = KIND_NOUNS[kind]
        return noun if name is None else f"{noun} {name!r}" if quote else f"{noun} {name}"
    field = KIND_SETTINGS[kind]
    return named(field, spelling) if name is None else given(field, name, spelling, quote=quote)


# The class in minisgl_core.api every registration of a kind must subclass (looked up only when a
# target is imported: discovery stays free of torch).
KIND_BASES = {
    "models": "Model",
    "attention": "AttentionBackend",
    "caches": "CacheManager",
    "policies": "SchedulingPolicy",
    "formats": "WeightFormat",
    "grammars": "GrammarBackend",
    "tool_parsers": "ToolParser",
    "reasoning_parsers": "ReasoningParser",
    "quantization": "QuantizationMethod",
}

#: How the core builds a class of each kind (docs/plugins.md gives each constructor): the call as
#: messages write it, and stand-in arguments to bind to the class's signature. A constructor that
#: cannot take the call is refused where the class is imported: at the call it was a TypeError
#: naming no plugin, after the model had loaded.
KIND_CALLS: dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]] = {
    "models": ("(config)", (None,), {}),
    "attention": ("(config)", (None,), {}),
    "caches": ("(page_size=...)", (), {"page_size": None}),
    "policies": ("()", (), {}),
    "formats": ("(path)", (None,), {}),
    "grammars": (
        "(tokenizer, vocab_size=..., stop_token_ids=...)",
        (None,),
        {"vocab_size": None, "stop_token_ids": None},
    ),
    "tool_parsers": ("(tools)", (None,), {}),
    "reasoning_parsers": ("()", (), {}),
    "quantization": ("(device=..., dtype=...)", (), {"device": None, "dtype": None}),
}

#: The kinds whose classes may take the process's context (API 2.9): a constructor with a
#: parameter named ``ctx`` gets ``ctx=`` the process's :class:`~minisgl_core.api.ProcessContext`
#: (its ``options``, its ``resolve``) beside the call above; one without is built as before.
CONTEXT_KINDS = ("caches", "policies", "tool_parsers", "reasoning_parsers")
#: the API that added it, which a plugin whose constructor requires ``ctx`` declares
CONTEXT_API = "2.9"


@functools.cache
def takes_context(cls: type) -> bool:
    """Whether ``cls``'s constructor has a parameter ``ctx`` the core can pass by keyword."""
    try:
        param = inspect.signature(cls).parameters.get("ctx")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY)


def build(cls: type, ctx: Any, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)`` as the core builds a plugin's class, with ``ctx=ctx`` (the
    process's ProcessContext) when its constructor takes one (see :data:`CONTEXT_KINDS`)."""
    if takes_context(cls):
        kwargs["ctx"] = ctx
    return cls(*args, **kwargs)


@functools.cache
def hook_versions() -> dict[str, str]:
    """Each hook's ``.. versionadded::`` (its docstring in hookspecs): the oldest API a plugin
    implementing it declares."""
    found = {}
    for name, spec in vars(hookspecs).items():
        if name.startswith("minisgl_") and inspect.isfunction(spec):
            added = re.search(r"\.\. versionadded:: (\d+\.\d+)", spec.__doc__ or "")
            found[name] = added[1] if added else "1.0"
    return found


def _hooks_newer_than(module: Any, api: str) -> list[tuple[str, str]]:
    """(hook, the API that added it) for each hook ``module`` implements that is newer than the
    ``api`` it declares."""
    declared = _api_version(api)
    return [
        (name, added)
        for name, added in sorted(hook_versions().items())
        if _is_hookimpl(getattr(module, name, None)) and _api_version(added) > declared
    ]


#: ``conflict``: two distributions have the plugin's name (entry-point name), so neither is loaded
Status = Literal["ok", "failed", "incompatible", "disabled", "conflict"]

#: legacy plugins already warned about, once a process
_WARNED_LEGACY: set[tuple[str, str, str]] = set()


class PluginError(RuntimeError):
    """A selected implementation cannot be used; the message says which plugin and what to do."""


class UnknownPluginName(PluginError, ValueError):
    """No loaded plugin registers the name selected (``LLM(attn="nope")``, ``--attn nope``): a bad
    argument, so a ValueError as every other bad setting (:class:`~minisgl_core.config.ConfigError`)
    is, and a PluginError as a selected plugin that cannot be used is."""


class NotRunnableHere(PluginError, ValueError):
    """The selected implementation does not run on this device (``LLM(attn="fi")`` on a CPU): a
    setting to change, so a ValueError as :class:`UnknownPluginName` is."""


@dataclass
class PluginInfo:
    name: str
    distribution: str
    version: str
    api: str | None = None
    status: Status = "ok"
    reason: str | None = None
    module: Any = None
    provides: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    #: kind -> names the plugin registered before it failed, or would register were its API
    #: compatible: never selectable, only for the errors of a user who selects one
    unusable: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    #: (the listing's status, why) when its ``minisgl_add_cli_options`` options were left out of
    #: a parser (see :meth:`Plugins.add_cli_options`): it loads, but users cannot set them
    options_left_out: tuple[Status, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "api": self.api,
            "status": self.status,
            "reason": self.reason,
            "provides": self.provides,
        }


@dataclass(frozen=True)
class Registration:
    kind: str
    name: str
    target: str
    plugin: PluginInfo


def _api_version(text: str) -> Version:
    """``"major.minor"`` as a Version; anything else (``"1"``, ``"1.0.0"``, ``"1.x"``) is a ValueError."""
    parts = text.split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"API version {text!r} is not 'major.minor'")
    return Version(text)


def _api_meant(text: str) -> str:
    """The ``MINISGL_API`` line a malformed one meant: ``"2"`` -> ``"2.0"``, ``"2.5.1"`` or
    ``"v2.5"`` -> ``"2.5"`` (the oldest API it needs, as a version's leading numbers say), else
    an example with the core's version."""
    numbers = re.fullmatch(r"\s*[vV]?(\d+)(?:\.(\d+))?(?:\.\d+)*\s*", text)
    if numbers is None:
        return f'the oldest API it needs as "major.minor", e.g. MINISGL_API = "{API_VERSION}"'
    return f'MINISGL_API = "{int(numbers[1])}.{int(numbers[2] or 0)}"'


#: The previous major a core still loads for one minor version, through the compatibility layer
#: (``minisgl_core.api.layers``, see :mod:`minisgl_core.api.deprecation`): API 2.0 loads plugins
#: written for any 1.x, with a deprecation warning; API 2.1 refuses them.
LEGACY_MAJOR = 1
LEGACY_UNTIL = "2.1"


def api_compatible(required: str, provided: str = API_VERSION) -> bool:
    """A plugin needing API ``required`` runs on a core providing ``provided``: same major, and
    the plugin's minor not newer; or ``required`` is of the previous major that ``provided`` still
    loads (:func:`api_legacy`). Compared as versions, so 1.10 is newer than 1.9."""
    need, have = _api_version(required), _api_version(provided)
    return (need.major == have.major and need <= have) or api_legacy(required, provided)


def api_legacy(required: str, provided: str = API_VERSION) -> bool:
    """Whether a plugin needing ``required`` runs on ``provided`` only through the previous major's
    compatibility layer (it loads, with a deprecation warning): a 1.x plugin on core API 2.0."""
    need, have = _api_version(required), _api_version(provided)
    return need.major == LEGACY_MAJOR and have.major == LEGACY_MAJOR + 1 and have < Version(LEGACY_UNTIL)


def api_upgrade_hint(required: str, distribution: str, provided: str = API_VERSION) -> str:
    """What to upgrade when a plugin needing ``required`` cannot run on ``provided``."""
    need, have = _api_version(required), _api_version(provided)
    if need > have:
        return "upgrade minisgl-core"
    if need.major < have.major:
        return (
            f"upgrade {distribution} to a release for API {provided} "
            f'(porting a plugin: docs/plugins.md, "Migrating from {need.major}.x")'
        )
    return f"upgrade {distribution} to a release for API {provided}"


class Plugins:
    """Every discovered plugin and what it registered."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self.registry: dict[str, dict[str, Registration]] = {k: {} for k in KINDS}
        # name -> every registration of it, for errors about collisions
        self.collisions: dict[tuple[str, str], list[Registration]] = {}
        #: how this process's user names the settings that select plugins, in errors: the command
        #: line's flags, or the Python API's keywords (``LLM``)
        self.spelling: Spelling = "flag"
        #: whether loading a 1.x plugin shows its deprecation warning (see :meth:`load`)
        self.deprecation_warnings = True
        #: plugins whose classes were imported and checked (see :meth:`resolve`), by plugin name
        self._classes_checked: set[str] = set()

    # ---------------------------------------------------------------- loading

    @classmethod
    def load(
        cls,
        allow: Iterable[str] | None = None,
        disable: Iterable[str] = (),
        entry_points: Iterable[metadata.EntryPoint] | None = None,
        spelling: Spelling = "flag",
        deprecation_warnings: bool = True,
    ) -> Plugins:
        """Discover and load plugins. ``allow`` None = all; ``disable`` names are skipped;
        ``spelling``: how errors name the settings that select plugins (``--attn`` or ``attn=``);
        ``deprecation_warnings`` False: a 1.x plugin's warning is not shown (the server's processes
        after the launcher, which showed it). Plugins that did not load are logged by
        :meth:`report_unloaded`, which the commands that run a model call once their selections
        are checked (an error about a selected plugin says it on its own).

        Defaults come from ``MINISGL_PLUGINS`` (allow-list; empty string = none) and
        ``MINISGL_DISABLE_PLUGINS`` (comma-separated)."""
        if allow is None:
            allow = environment.split_list(environment.get("MINISGL_PLUGINS"))
        disable = list(disable)
        from_env = set(environment.split_list(environment.get("MINISGL_DISABLE_PLUGINS")) or [])
        disabled = set(disable) | from_env
        allowed = None if allow is None else set(allow)
        self = cls()
        self.spelling = spelling
        self.deprecation_warnings = deprecation_warnings
        if entry_points is None:
            entry_points = metadata.entry_points(group=GROUP)
            _warn_shadowed(entry_points)
        entry_points = list(entry_points)
        names = sorted({ep.name for ep in entry_points})
        unknown = sorted(set(disable) - set(names))
        if unknown:  # a misspelt name would leave the plugin it meant loaded, silently
            # (a bad argument, a ValueError: LLM(disable_plugins=["nope"]) was a RuntimeError)
            raise UnknownPluginName(
                f"no plugin named {', '.join(map(repr, unknown))} to disable; installed: {', '.join(names)}"
            )
        for name in sorted((from_env | (allowed or set())) - set(names) - _WARNED_UNKNOWN):
            _WARNED_UNKNOWN.add(name)  # once a process (the command line loads the plugins twice)
            logger.warning(
                "MINISGL_DISABLE_PLUGINS or MINISGL_PLUGINS names %r: no installed plugin has that name", name
            )
        # plugin name -> its entry point in each distribution that has one (the same distribution
        # visible twice on sys.path counts once)
        by_name: dict[str, dict[str, metadata.EntryPoint]] = {}
        for ep in sorted(entry_points, key=lambda e: (e.name, _canonical(_distribution_name(e)))):
            by_name.setdefault(ep.name, {}).setdefault(_canonical(_distribution_name(ep)), ep)
        for name, eps in by_name.items():
            infos = [
                PluginInfo(
                    name=name,
                    distribution=_distribution_name(ep),
                    version=ep.dist.version if ep.dist else "?",
                )
                for ep in eps.values()
            ]
            self.infos.extend(infos)
            if len(infos) > 1:  # which one MINISGL_DISABLE_PLUGINS=name means is unknowable: neither loads
                who = _each([f"{i.distribution} {i.version}" for i in infos])
                neither = "neither" if len(infos) == 2 else "none"
                for info in infos:
                    info.status = "conflict"
                    info.reason = (
                        f"plugin name {name!r} is the entry point of {who}, so {neither} is loaded: "
                        f"uninstall one, or rename one's entry point in the {GROUP!r} group"
                    )
                continue
            info, ep = infos[0], next(iter(eps.values()))
            if name in disabled:
                info.status, info.reason = "disabled", "named in MINISGL_DISABLE_PLUGINS or --disable-plugin"
                continue
            if allowed is not None and name not in allowed:
                info.status, info.reason = "disabled", "not in the MINISGL_PLUGINS allow-list"
                continue
            self._load_one(info, ep)
        return self

    def report_unloaded(self) -> None:
        """A warning for each plugin that did not load for a fault of its own, once a process: a
        plugin whose import raised was otherwise seen only in ``minisgl plugins`` and the server's
        ready line, and ``generate`` or ``LLM()`` ran without it saying nothing."""
        for info in self.infos:
            if info.status in NOT_LOADED and info.name not in _WARNED_UNLOADED:
                _WARNED_UNLOADED.add(info.name)
                logger.warning(
                    "plugin %r (%s %s) is not loaded (%s): %s; `minisgl plugins` lists every plugin",
                    info.name, info.distribution, info.version, info.status, info.reason,
                )  # fmt: skip

    def _load_one(self, info: PluginInfo, ep: metadata.EntryPoint) -> None:
        try:
            module = ep.load()
        # (SystemExit: a module that calls sys.exit() on import ended `plugins --check` and `serve`
        # silently, with its status; KeyboardInterrupt stays the user's)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - any import failure is the plugin's
            info.status, info.reason = "failed", f"import failed: {type(exc).__name__}: {exc}"
            logger.debug("plugin %r: its import raised", ep.name, exc_info=True)  # (where: file, line)
            if ep.attr:  # (the AttributeError of a missing attribute does not say the value is wrong)
                info.reason += (
                    f"; the entry point's value must be the thin module itself, "
                    f"{ep.name} = {ep.module!r}, not {ep.value!r}"
                )
            return
        info.module = module
        api = getattr(module, "MINISGL_API", None)
        if not isinstance(api, str):
            info.status = "incompatible"
            example = f'MINISGL_API = "{API_VERSION}"'
            if api is None and ep.attr:  # (the module may declare it: the value names something in it)
                info.status = "failed"
                info.reason = (
                    f"the entry point's value must be the thin module itself, {ep.name} = {ep.module!r}, "
                    f"not {ep.value!r} (which names {type(module).__name__} {ep.attr!r} in it)"
                )
            elif api is None:
                info.reason = (  # (the oldest it needs, as docs/plugins.md says; not this core's)
                    f'declares no MINISGL_API: declare the oldest plugin API it needs, e.g. MINISGL_API = "2.0" '
                    f'(this core serves up to "{API_VERSION}")'
                )
            else:  # MINISGL_API = 2.0: a float, so 2.10 would read as 2.1
                if isinstance(api, (int, float)) and not isinstance(api, bool) and 0 <= api < 100:
                    # the version it meant, not the newest core's: a plugin declares the oldest
                    # API it needs, and the newest would refuse every core before it
                    example = (
                        f'MINISGL_API = "{api:.1f}"' if isinstance(api, int) else f'MINISGL_API = "{api}"'
                    )
                info.reason = (
                    f"MINISGL_API is {api!r} ({type(api).__name__}); declare it as a string: {example}"
                )
            self._note_unusable(info, module)
            return
        info.api = api
        try:
            compatible = api_compatible(info.api)
        except ValueError:
            info.status = "incompatible"
            info.reason = f"MINISGL_API {info.api!r} is not 'major.minor': declare {_api_meant(info.api)}"
            self._note_unusable(info, module)
            return
        if not compatible:
            fix = api_upgrade_hint(info.api, info.distribution)
            info.status = "incompatible"
            info.reason = f"needs minisgl API {info.api}, core provides {API_VERSION}: {fix}"
            self._note_unusable(info, module)
            return
        if api_legacy(info.api):
            self._warn_legacy(info, self.deprecation_warnings)
        wrong_hooks = _hook_mistakes(module)
        if wrong_hooks:
            info.status, info.reason = "failed", f"invalid hooks: {wrong_hooks}"
            self._note_unusable(info, module)
            return
        newer = _hooks_newer_than(module, info.api)
        if newer:  # (its MINISGL_API says an older core runs it: one without the hook refuses it)
            need = max((added for _, added in newer), key=_api_version)
            hooks = ", ".join(f"{hook} (added in API {added})" for hook, added in newer)
            info.status = "incompatible"
            info.reason = (
                f'declares MINISGL_API = "{info.api}" but implements {hooks}: declare '
                f'MINISGL_API = "{need}", the oldest API with every hook it implements'
            )
            self._note_unusable(info, module)
            return
        twin = next(
            (i for i in self.infos if i is not info and i.module is module and i.status == "ok"), None
        )
        if twin is not None:  # (pluggy's refusal lists every registered plugin: thousands of characters)
            info.status = "failed"
            info.reason = (
                f"its entry point names module {module.__name__!r}, as plugin {twin.name!r}'s does "
                f"({twin.distribution}): a module is one plugin; keep one of the two entry points"
            )
            return
        try:
            self.pm.register(module, name=info.name)
        except Exception as exc:  # noqa: BLE001 - e.g. a hookimpl with wrong argument names
            # (pluggy's message is three lines; the listing shows one)
            info.status, info.reason = "failed", f"invalid hooks: {' '.join(str(exc).split())}"
            self._note_unusable(info, module)
            return
        for kind, hook_name in KIND_HOOKS.items():
            registered: list[Registration] = []

            def register(name: str, target: str, _kind: str = kind, _out: list = registered) -> None:
                if not isinstance(name, str) or not isinstance(target, str) or ":" not in target:
                    raise TypeError(f"register(name, 'module:attr') got ({name!r}, {target!r})")
                if not _NAME.fullmatch(name):  # "" or "a b,c" was listed, yet no flag could select it
                    raise ValueError(
                        f"register() got the name {name!r}: a name is letters, digits and '_', '-', '.', "
                        "'+', starting with a letter or digit (no spaces; a comma separates names)"
                    )
                _out.append(Registration(_kind, name, target, info))

            caller = self.pm.subset_hook_caller(
                hook_name, remove_plugins=[p for p in self.pm.get_plugins() if p is not module]
            )
            try:
                returned = caller(register=register)  # (pluggy: the hook's results that are not None)
            except Exception as exc:  # noqa: BLE001
                info.status = "failed"
                info.reason = f"hook {hook_name} raised {type(exc).__name__}: {exc}"
                logger.debug("plugin %r: hook %s raised", info.name, hook_name, exc_info=True)  # (where)
                self._forget(info)
                # what it registers of every kind (those before the raise included), so that
                # selecting one says this, not "unknown" (its other hooks' names were lost)
                self._note_unusable(info, module)
                return
            if returned:  # registrations returned were dropped: listed ok, providing nothing
                info.status = "failed"
                info.reason = (
                    f"{hook_name} returned a {type(returned[0]).__name__}; "
                    "call register(name, target) instead"
                )
                self._forget(info)
                self._note_unusable(info, module)
                # a returned {name: target}: named in the error of a user who selects one
                names = returned[0] if isinstance(returned[0], dict) else {}
                info.unusable[kind] = [r.name for r in registered] + [n for n in names if isinstance(n, str)]
                return
            for reg in registered:
                self._add(reg)

    @staticmethod
    def _note_unusable(info: PluginInfo, module: Any) -> None:
        """What a plugin that will not load registers, asked of its hook functions directly (they
        only call ``register``), so that selecting one of its names says why it is unavailable.
        A misspelt registration hook (``minisgl_register_policy``) counts as the hook it meant:
        selecting a name it registers names the misspelling, not "unknown"."""
        hooks: dict[str, list[Any]] = {kind: [] for kind in KIND_HOOKS}
        kind_of = {hook_name: kind for kind, hook_name in KIND_HOOKS.items()}
        for name in dir(module):
            function = getattr(module, name, None)
            if not callable(function) or isinstance(function, type):
                continue
            meant = name if name in kind_of else _meant_hook(name) if _is_hookimpl(function) else None
            if meant in kind_of:
                hooks[kind_of[meant]].append(function)
        for kind, functions in hooks.items():
            if not functions:
                continue
            names: list[str] = []
            for hook in functions:
                try:
                    # (a parameter the hook does not pass, the plugin's mistake, gets None)
                    extra = {
                        p.name: None
                        for p in inspect.signature(hook).parameters.values()
                        if p.default is p.empty and p.name != "register"
                        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                    }  # fmt: skip
                    hook(register=lambda name, *_args, _out=names: _out.append(name), **extra)
                except Exception:  # noqa: BLE001 - best effort, for messages only
                    pass
            info.unusable[kind] = [n for n in names if isinstance(n, str)]

    @staticmethod
    def _warn_legacy(info: PluginInfo, show: bool = True) -> None:
        """A plugin written for the previous major loads (status ``ok``), with the note as its
        reason and a :class:`~minisgl_core.api.MinisglDeprecationWarning`, shown by default."""
        from minisgl_core.api.deprecation import MinisglDeprecationWarning

        info.reason = (
            f"written for minisgl API {info.api}: runs through the {LEGACY_MAJOR}.x compatibility "
            f"layer, which API {LEGACY_UNTIL} removes; port it to {API_VERSION} "
            f'(docs/plugins.md, "Migrating from 1.x") and declare MINISGL_API = "{API_VERSION}"'
        )
        key = (info.name, info.distribution, info.version)
        if not show or key in _WARNED_LEGACY:  # once a process (the command line loads the plugins twice)
            return
        _WARNED_LEGACY.add(key)
        if not sys.warnoptions:  # the user chose no filters: show each deprecation once per place
            warnings.filterwarnings("default", category=MinisglDeprecationWarning)
        # attributed to the plugin's MINISGL_API line, not to this loader
        filename, lineno = _api_line(info.module)
        warnings.warn_explicit(
            f"plugin {info.name!r} ({info.distribution} {info.version}) is {info.reason}",
            MinisglDeprecationWarning,
            filename,
            lineno,
            module=getattr(info.module, "__name__", info.name),
        )

    def _add(self, reg: Registration) -> None:
        table = self.registry[reg.kind]
        existing = table.get(reg.name)
        if existing is not None and existing.plugin is not reg.plugin:
            self.collisions.setdefault((reg.kind, reg.name), [existing]).append(reg)
        elif existing is None:
            table[reg.name] = reg
        if reg.name not in reg.plugin.provides[reg.kind]:
            reg.plugin.provides[reg.kind].append(reg.name)

    def _forget(self, info: PluginInfo, keep_collisions: bool = False) -> None:
        """Drop everything a plugin registered before it failed, so a half-registered plugin is not
        used (``keep_collisions``: the names it shares stay in conflict)."""
        for kind in KINDS:
            for name in [n for n, r in self.registry[kind].items() if r.plugin is info]:
                del self.registry[kind][name]
            for name in (
                [] if keep_collisions else info.provides[kind]
            ):  # a name it shared: the other's alone now
                rest = [r for r in self.collisions.pop((kind, name), []) if r.plugin is not info]
                if len(rest) > 1:
                    self.collisions[(kind, name)] = rest
                if rest:
                    self.registry[kind][name] = rest[0]
            info.provides[kind] = []
        try:
            self.pm.unregister(name=info.name)
        except ValueError:
            pass

    # ---------------------------------------------------------------- lookup

    def collision_note(self, kind: str, name: str, info: PluginInfo) -> str | None:
        """What ``minisgl plugins`` says about a name ``info`` registers that another distribution
        registers too (None if no other does)."""
        others = [r.plugin for r in self.collisions.get((kind, name), []) if r.plugin is not info]
        if not others:
            return None
        who = " and ".join(f"{o.distribution} (plugin {o.name!r})" for o in others)
        return (
            f"{name!r} ({KIND_HOOKS[kind]}) is registered by {who} too: selecting it is an error until "
            f"one of them is uninstalled or disabled (MINISGL_DISABLE_PLUGINS or --disable-plugin)"
        )

    def names(self, kind: str) -> list[str]:
        return sorted(self.registry[kind])

    def providers_of(self, kind: str, name: str) -> list[PluginInfo]:
        """Plugins that would provide ``name`` if they loaded (best effort for failed ones)."""
        return [i for i in self.infos if name in i.provides[kind]]

    def resolve(self, kind: str, name: str) -> type:
        """Import and return the class registered as ``name``, or raise PluginError saying why not."""
        clash = self.collisions.get((kind, name))
        if clash:  # the core does not pick one: which is meant is the user's to say
            who = _each([f"{r.plugin.distribution} (plugin {r.plugin.name!r})" for r in clash])
            plugins = " or ".join(dict.fromkeys(repr(r.plugin.name) for r in clash))
            raise PluginError(
                f"{selection(kind, name, self.spelling)} is provided by {who}; uninstall one, or "
                f"disable one by its plugin name ({plugins}) with MINISGL_DISABLE_PLUGINS or --disable-plugin"
            )
        reg = self.registry[kind].get(name)
        if reg is None:
            raise UnknownPluginName(self.missing_message(kind, name))
        module_name, _, attr = reg.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as exc:  # noqa: BLE001
            raise PluginError(
                f"{selection(kind, name, self.spelling)} from {reg.plugin.distribution} {reg.plugin.version} "
                f"(plugin {reg.plugin.name!r}) failed to import {reg.target}: {type(exc).__name__}: {exc}"
            ) from exc
        wrong = wrong_base_message(reg, obj, self.spelling)
        if wrong:
            raise PluginError(wrong)
        # a plugin with one class that does not import is failed, as `minisgl plugins` lists it:
        # none of its names is used (the plugin's classes only, so this stays cheap)
        if reg.plugin.name not in self._classes_checked:
            self._check_plugin_classes(reg.plugin)
            if reg.plugin.status != "ok":
                raise PluginError(self.missing_message(kind, name))
        return obj

    def lookup(self, kind: str, name: str) -> type:
        """:meth:`resolve` for a plugin asking for another's class (``ctx.resolve``, API 2.9): a
        name nothing registers is a LookupError that names the kind, the name and the names
        registered as that kind, not the user's flag (the user selected no such thing)."""
        if kind not in KINDS:
            raise ValueError(
                f"resolve({kind!r}, {name!r}): no kind {kind!r}; the kinds are {', '.join(KINDS)}"
            )
        try:
            return self.resolve(kind, name)
        except UnknownPluginName as exc:
            have = ", ".join(self.names(kind)) or "none"
            near = _near_name(kind, name, self.names(kind))
            hint = f"; did you mean {near!r}?" if near and near != name else ""
            # (a plugin that would provide it but did not load: resolve's message says which and why)
            why = "" if str(exc).startswith("unknown ") else f" ({exc})"
            raise LookupError(
                f"resolve({kind!r}, {name!r}): no loaded plugin registers {name!r} as one of the {kind}"
                f"{why}; registered {kind}: {have}{hint}"
            ) from None

    def resolve_on_device(self, kind: str, name: str, device: torch.device) -> type:
        """:meth:`resolve`, then the class asked whether it runs on ``device`` (its ``availability``:
        attention backends, quantization methods); NotRunnableHere "--attn fi cannot run on cpu:
        why; ..." if not. The one refusal for the early checks (the command line's, LLM's) and the
        model runner's."""
        cls = self.resolve(kind, name)
        why = cls.availability(device)
        if why is not None:
            # (attention has a choice that always runs: auto picks among the backends that run here)
            fix = (
                f"; use {given('attn', 'auto', self.spelling)} to pick one that does"
                if kind == "attention"
                else ""
            )
            raise NotRunnableHere(
                f"{selection(kind, name, self.spelling, quote=False)} cannot run on {device}: {why}{fix}"
            )
        return cls

    def check_classes(self) -> None:
        """Import every registered class and mark a plugin ``failed`` if one does not import (a
        missing module or class) or is not a subclass of its kind's base class (e.g. a policy
        registered as an attention backend).

        Imports the plugins' implementation modules (torch, kernels), so only ``minisgl plugins``
        calls it; every process checks the plugins of what it selects in :meth:`resolve`. Kernel
        libraries are imported lazily (docs/plugins.md, Publishing), so a class module imports on
        any machine and a failure here is the plugin's bug."""
        for info in list(self.infos):
            self._check_plugin_classes(info, listing=True)

    def _check_plugin_classes(self, info: PluginInfo, listing: bool = False) -> None:
        """Import each class ``info`` registered; one that does not import or has the wrong base
        fails the whole plugin (its names are unusable, so a start that selects any of them and
        the listing agree). ``listing``: also fail a plugin that implements no hook at all."""
        if info.status != "ok":
            return
        self._classes_checked.add(info.name)
        problems = []
        if listing and not any(info.provides.values()) and not _implements_a_hook(info.module):
            # (not refused at load: a plugin may be a deliberate no-op in some environment)
            problems.append(
                "implements no minisgl hook: define functions named after the hooks in "
                "minisgl_core.api.hookspecs, decorated with @hookimpl (docs/plugins.md, Hooks)"
            )
        for kind in KINDS:
            for reg in [r for r in self.registry[kind].values() if r.plugin is info]:
                try:
                    obj = _import_target(reg.target)
                except Exception as exc:  # noqa: BLE001 - the plugin's
                    problems.append(
                        f"{reg.name!r} ({KIND_HOOKS[kind]}) names {reg.target}, which does not "
                        f"import: {type(exc).__name__}: {exc}"
                    )
                    continue
                wrong = wrong_base_message(reg, obj, self.spelling)
                if wrong:
                    problems.append(wrong)
        if problems:
            info.status, info.reason = "failed", "; ".join(problems)
            for kind in KINDS:
                info.unusable[kind] = list(info.provides[kind])
            # a start imports only the plugins of what it selects, so there the names this plugin
            # shares still collide: the listing keeps saying so
            self._forget(info, keep_collisions=True)

    def missing_message(self, kind: str, name: str) -> str:
        """Why ``name`` cannot be selected: the broken plugin that would provide it, or what to install.
        Checks the classes of the plugins of ``kind`` first (as :meth:`resolve` checks a selected
        plugin's), so that the installed names it lists are those a start can use."""
        for info in [i for i in self.infos if i.provides[kind]]:
            if info.name not in self._classes_checked:
                self._check_plugin_classes(info)
        broken = [i for i in self.infos if i.status != "ok" and name in i.unusable[kind]]
        broken = broken or [i for i in self.infos if i.status != "ok" and _likely_provides(i, kind, name)]
        if broken:
            info = broken[0]
            state = {"conflict": "is in conflict", "failed": "failed to load"}.get(
                info.status, f"is {info.status}"
            )
            return (
                f"{selection(kind, name, self.spelling)} is unavailable: plugin {info.name!r} "
                f"({info.distribution} {info.version}) {state}: {info.reason}"
            )
        have = ", ".join(self.names(kind)) or "none"
        if not name.strip():  # (the hint was "pip install minisgl-plugin-")
            return f"{selection(kind, None, self.spelling)} needs a name; installed: {have}"
        near = _near_name(kind, name, self.names(kind))
        # (it said "pip install minisgl-plugin-NAME", a package no index has, for any name)
        source = checkout_plugin(kind, name)
        hint = (
            f"did you mean {selection(kind, near, self.spelling)}?"
            if near
            else f"install it from this checkout: pip install -e {source}"
            if source
            else "install a plugin that registers it"
        )
        # plugins that registered nothing (disabled, in conflict, or failed before registering) may have it
        unknown = [i for i in self.infos if i.status != "ok" and not any(i.unusable.values())]
        failed = [
            f"{i.name!r} ({i.distribution} {i.version}, {i.status}: {i.reason})"
            for i in unknown
            if i.status not in ("disabled", "conflict")
        ]
        # (one reason names every distribution of the plugin name)
        conflicts = {i.name: i.reason for i in unknown if i.status == "conflict"}
        disabled = [i.name for i in unknown if i.status == "disabled"]
        if failed:
            hint += f"; or it may be provided by a plugin that failed to load: {', '.join(failed)}"
        if conflicts:
            hint += f"; or by a plugin not loaded for a name conflict: {'; '.join(conflicts.values())}"
        if disabled:
            hint += f"; or by a disabled plugin: {', '.join(disabled)}"
        undiscovered = _undiscovered_distributions()
        if undiscovered:  # (a plugin under another entry-point group is never loaded, silently)
            hint += (
                f"; installed but never loaded, having no {GROUP!r} entry point: {'; '.join(undiscovered)}"
            )
        return f"unknown {selection(kind, name, self.spelling)}; installed: {have}; {hint}"

    # ---------------------------------------------------------------- reporting

    def state(self) -> list[list[Any]]:
        """What is loaded, one row a plugin: name, distribution, version, status and the names it
        registered by kind (plain values: the launcher hands its own to every process it starts)."""
        return [
            [i.name, i.distribution, i.version, i.status, {k: sorted(v) for k, v in i.provides.items()}]
            for i in self.infos
        ]

    def fingerprint(self) -> str:
        """Stable digest of :meth:`state`, compared across processes at start-up."""
        return hashlib.sha256(json.dumps(self.state(), sort_keys=True).encode()).hexdigest()[:16]

    def check_fingerprint(
        self, expected: str, where: str, launcher_state: list[list[Any]] | None = None
    ) -> None:
        """PluginError unless this process loaded what the launcher did (``expected``: its
        fingerprint); with the launcher's :meth:`state`, the message says what differs (the
        fingerprints and a plugin list that could be the same told nothing)."""
        mine = self.fingerprint()
        if mine == expected:
            return
        reasons = {i.name: i.reason for i in self.infos}
        differences = (
            state_differences(launcher_state, self.state(), reasons) if launcher_state is not None else []
        )
        what = "; ".join(differences) if differences else f"here: {self.summary()}"
        raise PluginError(
            f"{where} sees a different set of plugins than the launcher (fingerprint {mine} != "
            f"{expected}): {what}. Install the same plugins in every environment, use the same "
            "MINISGL_PLUGINS / MINISGL_DISABLE_PLUGINS settings, and register the same names in "
            "every process"
        )

    def summary(self) -> str:
        return ", ".join(
            f"{i.name} {i.version}" + ("" if i.status == "ok" else f" ({i.status})") for i in self.infos
        )

    def call_hook(self, hook_name: str, *, keep_going: bool = False, **kwargs: Any) -> list[PluginError]:
        """Call a non-registration hook on every loaded plugin, naming the plugin if one raises:
        raised at once, or with ``keep_going`` collected and returned while every other plugin's
        hook still runs (stop hooks, command-line options: one broken plugin took the later
        plugins' options and stop hooks with it)."""
        failures: list[PluginError] = []
        for info in self.infos:
            if info.status != "ok":
                continue
            caller = self.pm.subset_hook_caller(
                hook_name, remove_plugins=[p for p in self.pm.get_plugins() if p is not info.module]
            )
            try:
                caller(**kwargs)
            except Exception as exc:
                error = _hook_failure(info, hook_name, exc)
                if not keep_going:
                    raise error from exc
                failures.append(error)
        return failures

    def add_cli_options(self, parser: Any) -> list[PluginError]:
        """Each loaded plugin's ``minisgl_add_cli_options`` on a parser of its own, whose options
        join ``parser`` only when the hook returns and none of them clashes with an option already
        there: a hook that raised after adding some left them in ``--help`` and parsed, where the
        docs promise its options left out. The failures, each naming its plugin, are returned
        (every other plugin's options still join) and kept as the plugin's ``options_left_out``,
        which ``minisgl plugins`` lists."""
        return self._add_cli_options(parser)[1]

    def _add_cli_options(self, parser: Any) -> tuple[dict[str, tuple[Any, PluginInfo]], list[PluginError]]:
        """:meth:`add_cli_options`, also returning the argparse action of each option that joined,
        with its plugin, by ``dest``."""
        import argparse

        failures: list[PluginError] = []
        joined: dict[str, tuple[Any, PluginInfo]] = {}
        owners: dict[str, str] = {}  # option string -> the plugin that added it here
        for info in self.infos:
            if info.status != "ok":
                continue
            own = argparse.ArgumentParser(add_help=False)
            caller = self.pm.subset_hook_caller(
                "minisgl_add_cli_options",
                remove_plugins=[p for p in self.pm.get_plugins() if p is not info.module],
            )
            try:
                caller(parser=own)
                # (checked first: argparse's merge would add the options before a clash)
                taken = [
                    o for a in own._actions for o in a.option_strings if o in parser._option_string_actions
                ]
                if not taken:  # argparse's own merge, as for ``parents=``: groups kept
                    parser._add_container_actions(own)
            except Exception as exc:
                info.options_left_out = (
                    "failed",
                    f"hook minisgl_add_cli_options raised {type(exc).__name__}: {exc}, so its CLI "
                    "options were left out",
                )
                failures.append(_hook_failure(info, "minisgl_add_cli_options", exc))
                continue
            if taken:  # two meanings for one flag: the plugin's options are left out, whole
                clash = ", ".join(
                    f"{o} is taken by {f'plugin {owners[o]!r}' if o in owners else 'the core'}"
                    for o in sorted(taken)
                )
                info.options_left_out = ("conflict", f"its CLI options were left out: {clash}")
                failures.append(
                    PluginError(
                        f"plugin {info.name!r} ({info.distribution} {info.version}) hook "
                        f"minisgl_add_cli_options: {clash}: rename the plugin's options (--{info.name}-...)"
                    )
                )
                continue
            for action in own._actions:
                owners.update(dict.fromkeys(action.option_strings, info.name))
                joined[action.dest] = (action, info)
        return joined, failures

    def option_actions(self, core: Any = None) -> tuple[dict[str, tuple[Any, PluginInfo]], list[PluginError]]:
        """The plugins' own options (``minisgl_add_cli_options``), by argparse ``dest``: each
        option's action and plugin, as they join ``core`` (a parser holding the core's options,
        so that a plugin taking one of them is left out as under ``serve``; None: an empty
        one), and the failures of the plugins whose options were left out."""
        import argparse

        parser = argparse.ArgumentParser(add_help=False)
        if core is not None:
            parser._add_container_actions(core)
        return self._add_cli_options(parser)

    def option_defaults(self, core: Any = None) -> dict[str, Any]:
        """The plugins' own options by argparse ``dest``, each at its default as the command line
        would parse it: what ``ctx.options`` holds under ``serve`` when none is given, so that the
        offline ``LLM`` hands plugins the same keys (a plugin reading
        ``ctx.options["example_max_wait"]`` got a KeyError offline). ``core``: as for
        :meth:`option_actions`."""
        return {dest: option_default(action) for dest, (action, _) in self.option_actions(core)[0].items()}

    def unavailable_here(self) -> dict[str, str]:
        """Loaded plugins that cannot run on this machine (plugin name -> why): those whose every
        attention backend's ``availability()`` refuses the machine's device (CUDA when it has one,
        else the CPU). Cheap: imports the backend classes, which start no kernels. A backend that
        does not import is no question of this machine: :meth:`check_classes` reports it."""
        import torch

        cuda = torch.cuda.is_available()
        device = torch.device("cuda" if cuda else "cpu")
        out: dict[str, str] = {}
        for info in self.infos:
            # not a name another distribution registers too: no question of this machine, and
            # the listing says what is wrong with it
            backends = [n for n in info.provides["attention"] if ("attention", n) not in self.collisions]
            if (
                info.status != "ok"
                or not backends
                or any(v for k, v in info.provides.items() if k != "attention")
            ):
                continue
            reasons = []
            for name in backends:
                try:
                    backend = _import_target(self.registry["attention"][name].target)
                    why = backend.availability(device)
                except Exception:  # noqa: BLE001 - check_classes says what is wrong
                    break
                if why is None:
                    break
                reasons.append(why)
            else:
                why = "; ".join(reasons)
                out[info.name] = f"no CUDA device ({why})" if not cuda else why
        return out

    def listing(self) -> list[dict[str, Any]]:
        """What ``minisgl plugins --json`` prints: each plugin, with status ``unavailable`` (and why)
        where it loaded but cannot run on this machine, and ``conflict`` where a name it registers
        cannot be selected because another distribution registers it too (every plugin involved,
        with a note naming the others)."""
        unavailable = self.unavailable_here()
        rows = []
        for info in self.infos:
            row = info.to_json()
            # each name's class, "module:Class": what a plugin that builds on another imports
            row["targets"] = {
                kind: {reg.name: reg.target for reg in self.registry[kind].values() if reg.plugin is info}
                for kind in KINDS
                if info.provides[kind]
            }
            notes = [
                note
                for kind in KINDS
                for name in info.provides[kind]
                if (note := self.collision_note(kind, name, info)) is not None
            ]
            if info.status == "ok" and info.name in unavailable:
                row["status"], row["reason"] = "unavailable", unavailable[info.name]
            if row["status"] in ("ok", "unavailable") and info.options_left_out is not None:
                # it loads, but users cannot set its options: --check fails it, as a name
                # collision or a hook that raised would
                status, why = info.options_left_out
                row["status"] = status
                row["reason"] = "; ".join([*([row["reason"]] if row["reason"] else []), why])
            if notes:
                if row["status"] in ("ok", "unavailable"):
                    row["status"] = "conflict"
                row["reason"] = "; ".join([*([row["reason"]] if row["reason"] else []), *notes])
            rows.append(row)
        return rows

    def format_table(self) -> str:
        lines = [f"{'plugin':<16} {'distribution':<30} {'version':<9} {'api':<5} {'status':<13} provides"]
        for row in self.listing():
            provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in row["provides"].items() if v) or "-"
            lines.append(
                f"{row['name']:<16} {row['distribution']:<30} {row['version']:<9} {row['api'] or '-':<5} "
                f"{row['status']:<13} {provides}"
            )
            if row["reason"]:
                lines.append(f"{'':<16} {row['status']}: {row['reason']}")
        return "\n".join(lines)


def option_default(action: Any) -> Any:
    """An argparse option's default as the command line parses it (a string default goes through
    the option's ``type``; one its own type refuses stays as written)."""
    value = action.default
    if isinstance(value, str) and callable(action.type):
        try:
            value = action.type(value)
        except Exception:  # noqa: BLE001 - the plugin's default, as written
            pass
    return value


def _hook_failure(info: PluginInfo, hook_name: str, exc: Exception) -> PluginError:
    """A plugin's hook that raised, as the error naming the plugin, its distribution and the hook.
    The exception's traceback (the line of the plugin's that raised) goes to the debug log: the
    error is one line, and its author needs the line."""
    logger.debug("plugin %r: hook %s raised", info.name, hook_name, exc_info=exc)
    return PluginError(
        f"plugin {info.name!r} ({info.distribution} {info.version}) hook {hook_name} "
        f"raised {type(exc).__name__}: {exc}"
    )


def state_differences(
    launcher: list[list[Any]], here: list[list[Any]], reasons_here: dict[str, str | None] | None = None
) -> list[str]:
    """What differs between two :meth:`Plugins.state` rows, plugin by plugin, in words;
    ``reasons_here``: each plugin's reason in this process, said with a status that differs (a
    plugin whose import failed only in a worker said "failed here" and not why)."""
    theirs, mine = {row[0]: row for row in launcher}, {row[0]: row for row in here}
    found = []
    for name in sorted(theirs.keys() | mine.keys()):
        a, b = theirs.get(name), mine.get(name)
        if b is None:
            found.append(f"plugin {name!r} ({a[1]} {a[2]}) is loaded in the launcher, not here")
        elif a is None:
            found.append(f"plugin {name!r} ({b[1]} {b[2]}) is loaded here, not in the launcher")
        else:
            for i, label in ((1, "distribution"), (2, "version"), (3, "status")):
                if a[i] != b[i]:
                    why = (reasons_here or {}).get(name) if label == "status" else None
                    found.append(
                        f"plugin {name!r} has {label} {a[i]} in the launcher, {b[i]} here"
                        + (f": {why}" if why else "")
                    )
            for kind in sorted(a[4].keys() | b[4].keys()):
                if a[4].get(kind, []) != b[4].get(kind, []):
                    found.append(
                        f"plugin {name!r} registered {kind} {a[4].get(kind, [])} in the launcher, "
                        f"{b[4].get(kind, [])} here"
                    )
    return found


def wrong_base_message(reg: Registration, obj: Any, spelling: Spelling = "flag") -> str | None:
    """None when ``obj`` is a class of the registration's kind that the core can build, else what
    is wrong and the fix (the selection named as ``spelling`` says: ``--attn`` or ``attn=``)."""
    import minisgl_core.api as api

    base_name = KIND_BASES[reg.kind]
    if isinstance(obj, type) and issubclass(obj, getattr(api, base_name)):
        # (by the methods' own mark, not ``__abstractmethods__``: Model is an nn.Module, whose
        # metaclass is not ABCMeta, so a model class missing its forward was listed ok)
        missing = sorted(
            name for name in dir(obj) if getattr(getattr(obj, name, None), "__isabstractmethod__", False)
        )
        if not missing:
            return wrong_constructor_message(reg, obj, spelling)
        # (listed as ok, it failed only when selected: a traceback, or a 500 on every tools request)
        return (
            f"plugin {reg.plugin.name!r} ({reg.plugin.distribution} {reg.plugin.version}) registered "
            f"{reg.target} as {selection(reg.kind, reg.name, spelling)}, but it does not implement "
            f"{base_name}'s abstract method{'s' if len(missing) > 1 else ''} {', '.join(missing)}: "
            f"define {'them' if len(missing) > 1 else 'it'} in {obj.__name__} (docs/plugins.md, {base_name})"
        )
    what = obj.__name__ if isinstance(obj, type) else f"{type(obj).__name__} object"
    return (
        f"plugin {reg.plugin.name!r} ({reg.plugin.distribution} {reg.plugin.version}) registered "
        f"{reg.target} ({what}) as {selection(reg.kind, reg.name, spelling)} through {KIND_HOOKS[reg.kind]}, "
        f"but it is not a subclass of minisgl_core.api.{base_name}: register it through the hook of "
        f"its kind, or make it subclass {base_name}"
    )


def wrong_constructor_message(reg: Registration, cls: type, spelling: Spelling = "flag") -> str | None:
    """None when ``cls``'s constructor takes the call the core builds its kind with
    (:data:`KIND_CALLS`), else what is wrong and the fix."""
    call, args, kwargs = KIND_CALLS[reg.kind]
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # (no signature to read: the call itself will tell)
        return None
    context = signature.parameters.get("ctx")
    if reg.kind in CONTEXT_KINDS and takes_context(cls):
        kwargs = {**kwargs, "ctx": None}
        declared = reg.plugin.api
        if (
            context.default is context.empty
            and declared
            and _api_version(declared) < _api_version(CONTEXT_API)
        ):
            # (an older core would build it without ctx: a TypeError naming no plugin)
            return (
                f"plugin {reg.plugin.name!r} ({reg.plugin.distribution} {reg.plugin.version}) registered "
                f"{reg.target} as {selection(reg.kind, reg.name, spelling)}, whose constructor requires "
                f"ctx, which the core passes since API {CONTEXT_API}, but the plugin declares "
                f'MINISGL_API = "{declared}": declare MINISGL_API = "{CONTEXT_API}" (or give ctx a default)'
            )
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        # shown without annotations and defaults' types: the parameters are what is wrong
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        name, base_name = cls.__name__, KIND_BASES[reg.kind]
        return (
            f"plugin {reg.plugin.name!r} ({reg.plugin.distribution} {reg.plugin.version}) registered "
            f"{reg.target} as {selection(reg.kind, reg.name, spelling)}, but the core builds it as {name}{call} "
            f"and its constructor takes {name}{bare} ({exc}): make {name}.__init__ accept that call, "
            f"any other parameter with a default (docs/plugins.md, {base_name})"
        )
    return None


def _import_target(target: str) -> Any:
    """The object a ``"module:attr"`` registration names (imports its module)."""
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _hook_mistakes(module: Any) -> str | None:
    """Functions of a plugin module the core would silently never call: a ``@hookimpl`` whose name
    is no hook (misspelt), or a hook's name without ``@hookimpl``; None if there is none."""
    marker = f"{hookspecs.PROJECT}_impl"
    known = {name for name in dir(hookspecs) if name.startswith("minisgl_")}
    mistakes = []
    for name in sorted(dir(module)):
        obj = getattr(module, name, None)
        if not callable(obj) or isinstance(obj, type):
            continue
        marked = hasattr(obj, marker)
        if marked and name not in known:
            close = _meant_hook(name)
            hint = f" (did you mean {close}?)" if close else ""
            mistakes.append(f"{name} is not a minisgl hook{hint}")
        elif not marked and name in known:
            mistakes.append(f"{name} lacks @hookimpl, so the core would never call it")
        elif marked:
            passed = list(inspect.signature(getattr(hookspecs, name)).parameters)
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            extra = [p.name for p in params if p.default is p.empty and p.name not in passed
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
            if extra:
                mistakes.append(
                    f"{name} takes {', '.join(extra)}, which the hook does not pass "
                    f"(it passes {', '.join(passed)}, by keyword; take any of them)"
                )
    return "; ".join(mistakes) or None


def _meant_hook(name: str) -> str | None:
    """The hook a misspelt hook function's name is closest to (None: none is close)."""
    known = sorted(name for name in dir(hookspecs) if name.startswith("minisgl_"))
    close = difflib.get_close_matches(name, known, n=1)
    return close[0] if close else None


def _is_hookimpl(function: Any) -> bool:
    return hasattr(function, f"{hookspecs.PROJECT}_impl")


def _implements_a_hook(module: Any) -> bool:
    marker = f"{hookspecs.PROJECT}_impl"
    return any(hasattr(getattr(module, name, None), marker) for name in dir(module))


def _api_line(module: Any) -> tuple[str, int]:
    """The file of a plugin's thin module and the line declaring ``MINISGL_API`` (else 1)."""
    filename = getattr(module, "__file__", None) or "<plugin>"
    try:
        with open(filename, encoding="utf-8") as source:
            for number, line in enumerate(source, 1):
                if line.startswith("MINISGL_API"):
                    return filename, number
    except OSError:
        pass
    return filename, 1


def _warn_shadowed(entry_points: Iterable[metadata.EntryPoint]) -> None:
    """A warning, once a process, for each plugin distribution whose metadata is found twice with
    a different version or different plugin entry points: importlib.metadata takes the first found
    and hides the other, silently. The usual cause is a stale ``*.egg-info`` that a build left in a
    plugin's source folder on PYTHONPATH, beside the ``.dist-info`` meant (found first in the same
    folder, it won: the old version and entry points were loaded). The same metadata twice (one
    distribution on two sys.path entries) is no warning."""
    for name in sorted({_distribution_name(ep) for ep in entry_points if ep.dist is not None}):
        if name in _WARNED_SHADOWED:
            continue
        found = list(metadata.distributions(name=name))
        used, hidden = found[0], [d for d in found[1:] if _dist_key(d) != _dist_key(found[0])]
        if not hidden:
            continue
        _WARNED_SHADOWED.add(name)
        logger.warning(
            "distribution %s has metadata in more than one place: using %s (version %s), not %s; "
            "remove the stale one (e.g. a *.egg-info a build left in the plugin's source folder)",
            name, _dist_where(used), used.version,
            ", ".join(f"{_dist_where(d)} (version {d.version})" for d in hidden),
        )  # fmt: skip


def _dist_key(dist: metadata.Distribution) -> tuple[str, list[tuple[str, str]]]:
    """What of a distribution's metadata the plugins see: its version and plugin entry points."""
    return dist.version, sorted((ep.name, ep.value) for ep in dist.entry_points if ep.group == GROUP)


def _dist_where(dist: metadata.Distribution) -> str:
    """The folder of a distribution's metadata (``.dist-info``, ``.egg-info``), as importlib's path
    distributions keep it."""
    return str(getattr(dist, "_path", dist))


def _distribution_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.metadata["Name"] if ep.dist else "?"


def _each(items: list[str]) -> str:
    """``both a and b``; ``each of a, b and c``."""
    if len(items) == 2:
        return f"both {items[0]} and {items[1]}"
    return f"each of {', '.join(items[:-1])} and {items[-1]}"


def _canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _undiscovered_distributions() -> list[str]:
    """Installed ``minisgl-plugin-*`` distributions that declare no entry point in :data:`GROUP`
    (one under ``minisgl_plugins`` or ``minisgl.plugin``), each with the groups it does declare."""
    found = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if not _canonical(name).startswith("minisgl-plugin-"):
            continue
        groups = sorted({ep.group for ep in dist.entry_points})
        if GROUP not in groups:
            found.add(f"{name} {dist.version} (entry-point groups: {', '.join(map(repr, groups)) or 'none'})")
    return sorted(found)


def checkout_plugin(kind: str, name: str) -> str | None:
    """The folder of this checkout of minisgl holding the first-party plugin that registers
    ``name`` as a ``kind`` (``plugins/attention/fi``, relative to the working directory when inside
    it), or None: not run from a checkout, or no plugin there registers it."""
    folder = _checkout_registry().get((kind, name))
    if folder is None:
        return None
    relative = os.path.relpath(folder)
    return str(folder) if relative.startswith("..") else relative


@functools.cache
def _checkout_registry() -> dict[tuple[str, str], Path]:
    """(kind, name) -> folder, for each name the first-party plugins of this checkout register,
    read from the tree itself (it was a table of kinds' folders kept by hand beside a rule of
    names, which missed ``fp8-head``, ``MistralForCausalLM``, ``Qwen3MoeForCausalLM``...): each
    plugin of ``plugins/<group>/<plugin>/`` (a pyproject.toml beside its ``minisgl_plugin_*``
    package, whose ``__init__`` is the entry point), the functions there named after a
    registration hook and their ``register("NAME", ...)`` calls with a literal name. Parsed, not
    imported: the plugin is not installed (that is why it is looked for), nor, maybe, what it
    needs. Empty outside a checkout (an installed minisgl_core has no plugins/ beside it)."""
    import ast

    kind_of_hook = {hook: kind for kind, hook in KIND_HOOKS.items()}
    found: dict[tuple[str, str], Path] = {}
    for project in sorted((Path(__file__).resolve().parent.parent / "plugins").glob("*/*/pyproject.toml")):
        for module in sorted(project.parent.glob("minisgl_plugin_*/__init__.py")):
            try:
                source = ast.parse(module.read_text())
            except (OSError, SyntaxError, ValueError):
                continue
            hooks = [n for n in source.body if isinstance(n, ast.FunctionDef) and n.name in kind_of_hook]
            for hook in hooks:
                for call in ast.walk(hook):
                    if (
                        isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Name)
                        and call.func.id == "register"
                        and call.args
                        and isinstance(call.args[0], ast.Constant)
                        and isinstance(call.args[0].value, str)
                    ):
                        found.setdefault((kind_of_hook[hook.name], call.args[0].value), project.parent)
    return found


def _plugin_hint(kind: str, name: str) -> str:
    if kind == "models":
        return name.removesuffix("ForCausalLM").lower()
    if kind == "tool_parsers":
        return name.replace("_", "-")
    if kind == "reasoning_parsers":
        return f"{name.replace('_', '-')}-reasoning"
    return name


#: other engines' names for installed backends (SGLang's --attention-backend, vLLM's), which a
#: user coming from them types: ``--attn flashinfer`` means fi
_NAMES_ELSEWHERE = {
    "attention": {
        "flashinfer": "fi",
        "flash_attn": "fa3",
        "flash-attn": "fa3",
        "flashattention": "fa3",
        "torch_native": "torch",
        "torch_sdpa": "torch",
        "sdpa": "torch",
    }
}


#: the names of a kind the core takes itself, no plugin registering them: ``--attn AUTO`` means auto
_CORE_NAMES = {"attention": ("auto",), "quantization": ("none",)}


def _near_name(kind: str, name: str, installed: list[str]) -> str | None:
    """The installed name ``name`` likely means (a typo: ``radx``, ``flashinfr``; another
    engine's name: ``flashinfer``), or None. Not for model architectures, which come from the
    model's config.json, where a near name is another model (MambaForCausalLM, LlamaForCausalLM)."""
    if kind == "models":
        return None
    known = {n: n for n in [*installed, *_CORE_NAMES.get(kind, ())]} | {
        other: ours for other, ours in _NAMES_ELSEWHERE.get(kind, {}).items() if ours in installed
    }
    folded = {n.casefold(): ours for n, ours in known.items()}
    if name.casefold() in folded:  # INT8, Radix: the name in another case
        return folded[name.casefold()]
    # 0.7: one slip in a name of four letters or more (radx, trtion), not fp4 for fp8
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.7)
    return known[close[0]] if close else None


def _likely_provides(info: PluginInfo, kind: str, name: str) -> bool:
    """A plugin that did not load, named like the selection (``fi`` for ``--attn fi``)."""
    return info.name == _plugin_hint(kind, name)

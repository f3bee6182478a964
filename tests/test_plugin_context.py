"""API 2.9, what plugin authors writing from the docs missed: another plugin's class through
``ctx.resolve``, a component's options through its ``ctx`` argument (no module global), and a
hook newer than the plugin's ``MINISGL_API`` refused at load. Each with a real plugin
distribution on sys.path (the ``install_plugin_module`` fixture), loaded by the core."""

from __future__ import annotations

import os
import re

import pytest

from minisgl_core import LLM
from minisgl_core.api import ProcessContext, hookspecs
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.plugins import PluginError, Plugins, hook_versions
from minisgl_core.sampling import SamplingParams

#: a cache wrapping whatever is registered as radix, and a policy reading its plugin's option,
#: both through the ctx the core builds them with
WRAPPER = """
from minisgl_core.api import CacheManager, DecodePlan, SchedulingPolicy, hookimpl, plan_prefill

MINISGL_API = "2.9"


class CountingCache(CacheManager):
    def __init__(self, *, page_size, ctx):
        self.inner = ctx.resolve("caches", "radix")(page_size=page_size)
        self.role = ctx.role
        self.hits = 0

    def match_prefix(self, tokens):
        match = self.inner.match_prefix(tokens)
        self.hits += len(match.slots) > 0
        return match

    def lock(self, handle):
        self.inner.lock(handle)

    def unlock(self, handle):
        self.inner.unlock(handle)

    def insert_prefix(self, tokens, slots):
        return self.inner.insert_prefix(tokens, slots)

    def evict(self, num_tokens):
        return self.inner.evict(num_tokens)

    def size_info(self):
        return self.inner.size_info()

    def check_integrity(self):
        self.inner.check_integrity()


class AgingPolicy(SchedulingPolicy):
    def __init__(self, ctx):
        self.max_wait = ctx.options["t29_max_wait"]

    def schedule(self, state):
        plan = plan_prefill(state, sorted(state.waiting, key=lambda r: r.arrival))
        if plan is None and state.running:
            return DecodePlan([r.rid for r in state.running])
        return plan


@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t29-max-wait", type=int, default=32)


@hookimpl
def minisgl_register_caches(register):
    register("t29-counting", "minisgl_t29wrap:CountingCache")


@hookimpl
def minisgl_register_policies(register):
    register("t29-aging", "minisgl_t29wrap:AgingPolicy")
"""


def test_a_cache_wraps_the_radix_cache_and_a_policy_reads_its_option_through_ctx(
    tmp_path, install_plugin_module
):
    """(a) and (b): built offline by the engine with the process's context, the wrapper finds the
    radix class through ``ctx.resolve`` (was: the internal ``Plugins.resolve``), and the policy its
    ``--t29-max-wait`` in ``ctx.options`` (was: a module global set in minisgl_process_start; a
    constructor taking ctx was refused, the core building it with no arguments)."""
    from minisgl_plugin_radix.cache import RadixCache

    install_plugin_module("minisgl_t29wrap", "minisgl-t29wrap", WRAPPER)
    model_dir = make_model_dir(tmp_path / "m", "Qwen3ForCausalLM", max_position_embeddings=512)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompt = [[11, 12, 13, 14, 15, 16, 17, 18] * 4]
    with LLM(
        model_dir,
        device="cpu",
        attn="torch",
        num_kv_tokens=2048,
        page_size=1,
        cache="t29-counting",
        policy="t29-aging",
        plugin_options={"t29_max_wait": 7},
    ) as llm:
        first = llm.generate(prompt, params, use_tqdm=False)[0].token_ids
        again = llm.generate(prompt, params, use_tqdm=False)[0].token_ids
        cache = llm.engine.scheduler.kv.cache
        policy = llm.engine.scheduler.policy
    assert type(cache.inner) is RadixCache and cache.role == "offline"
    assert cache.hits >= 1, "the second request reuses the first one's prefix through the wrapped radix cache"
    assert first == again
    assert policy.max_wait == 7


def test_resolve_names_the_kind_the_name_and_the_registered_names(install_plugin_module):
    install_plugin_module("minisgl_t29wrap", "minisgl-t29wrap", WRAPPER)
    plugins = Plugins.load(deprecation_warnings=False)
    ctx = ProcessContext(role="scheduler", _plugins=plugins)
    from minisgl_plugin_naive.cache import NaiveCache

    assert ctx.resolve("caches", "naive") is NaiveCache
    with pytest.raises(LookupError) as missing:
        ctx.resolve("caches", "radx")
    registered = ", ".join(plugins.names("caches"))
    assert "radix" in registered and "t29-counting" in registered
    assert str(missing.value) == (
        f"resolve('caches', 'radx'): no loaded plugin registers 'radx' as one of the caches; "
        f"registered caches: {registered}; did you mean 'radix'?"
    )
    with pytest.raises(ValueError, match=r"no kind 'cache'; the kinds are models, attention, caches"):
        ctx.resolve("cache", "radix")
    with pytest.raises(RuntimeError, match="built without the process's plugins"):
        ProcessContext(role="api").resolve("caches", "radix")


BROKEN_PROVIDER = """
from minisgl_core.api import hookimpl

MINISGL_API = "2.9"


@hookimpl
def minisgl_register_caches(register):
    register("t29-gone", "minisgl_t29gone:Nope")
    raise RuntimeError("boom")
"""


def test_resolve_of_a_name_whose_plugin_failed_says_why(install_plugin_module):
    install_plugin_module("minisgl_t29gone", "minisgl-t29gone", BROKEN_PROVIDER)
    ctx = ProcessContext(role="scheduler", _plugins=Plugins.load(deprecation_warnings=False))
    with pytest.raises(
        LookupError, match=r"plugin 't29gone' \(minisgl-t29gone 0.1.0\) failed to load: .*boom"
    ):
        ctx.resolve("caches", "t29-gone")


PARSER = """
from minisgl_core.api import TagReasoningParser, hookimpl

MINISGL_API = "2.9"


class Tagged(TagReasoningParser):
    def __init__(self, ctx):
        super().__init__()
        # (the start builds it once, in the API process: say what ctx brought)
        raise RuntimeError(f"built with tag {ctx.options['t29p_tag']} in {ctx.role}")


@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t29p-tag", default="unset")


@hookimpl
def minisgl_register_reasoning_parsers(register):
    register("t29p", "minisgl_t29p:Tagged")
"""


def test_a_parser_gets_its_option_through_ctx_under_serve(tmp_path, install_plugin_module):
    """(b) for parsers: ``serve`` builds the reasoning parser in the API process with that
    process's context, holding the plugin's flag (the parser raises to say what it got: the start
    stops there, naming it, before any worker)."""
    from minisgl_core.testing.cli_runner import run_cli

    install_plugin_module("minisgl_t29p", "minisgl-t29p", PARSER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = ["serve", "--model", "demo", "--port", "0", "--reasoning-parser", "t29p", "--t29p-tag", "blue"]
    proc = run_cli(args, env=env, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: built with tag blue in api" in proc.stderr.splitlines()[-1], proc.stderr


#: (its own module name: the loader's import of minisgl_t29wrap is cached from the tests above)
REQUIRES_CTX_ON_28 = WRAPPER.replace('MINISGL_API = "2.9"', 'MINISGL_API = "2.8"').replace(
    "t29wrap", "t29wrap28"
)


def test_a_constructor_requiring_ctx_needs_api_2_9(install_plugin_module):
    """A 2.8 core builds a policy with no arguments: a plugin whose constructor requires ctx and
    declares 2.8 would fail there with a TypeError naming no plugin, so it is refused here,
    naming the class and the version to declare."""
    install_plugin_module("minisgl_t29wrap28", "minisgl-t29wrap28", REQUIRES_CTX_ON_28)
    plugins = Plugins.load(deprecation_warnings=False)
    with pytest.raises(PluginError) as refused:
        plugins.resolve("policies", "t29-aging")
    assert (
        "plugin 't29wrap28' (minisgl-t29wrap28 0.1.0) registered minisgl_t29wrap28:AgingPolicy as --policy "
        "'t29-aging', whose constructor requires ctx, which the core passes since API 2.9, but the plugin "
        'declares MINISGL_API = "2.8": declare MINISGL_API = "2.9"'
    ) in str(refused.value)


# ---------------------------------------------------------------- (c) hooks newer than MINISGL_API

HOOKS_ON_20 = """
from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_policies(register):
    register("t29-old", "minisgl_t29old:Nothing")


@hookimpl
def minisgl_process_stop(ctx):
    pass
"""


def test_every_hook_says_which_api_added_it_as_the_docs_do():
    """The table the load check reads is the hookspecs' own ``versionadded``, and agrees with
    docs/plugins.md's *Since API x.y* under each hook."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    versions = hook_versions()
    specs = {n for n in vars(hookspecs) if n.startswith("minisgl_") and callable(getattr(hookspecs, n))}
    assert set(versions) == specs
    for hook, added in versions.items():
        assert f".. versionadded:: {added}" in getattr(hookspecs, hook).__doc__
        section = doc[doc.index(f"### {hook}\n") :]
        section = section[: section.index("\n### ", 5)]
        assert f"*Since API {added}.*" in section, hook


def test_a_hook_newer_than_the_declared_api_makes_the_plugin_incompatible(install_plugin_module, monkeypatch):
    """No hook is newer than 2.0 yet (1.x plugins are refused since 2.1, so every loaded plugin
    declares 2.0 or later): the first one added after it is stood in for by raising
    ``minisgl_process_stop``'s version in the table the loader reads, as a 2.10 hookspec would."""
    import minisgl_core.plugins as plugins_module

    install_plugin_module("minisgl_t29old", "minisgl-t29old", HOOKS_ON_20)
    assert (
        next(i for i in Plugins.load(deprecation_warnings=False).infos if i.name == "t29old").status == "ok"
    )

    monkeypatch.setattr(
        plugins_module, "hook_versions", lambda: {**hook_versions(), "minisgl_process_stop": "2.5"}
    )
    plugins = Plugins.load(deprecation_warnings=False)
    [info] = [i for i in plugins.infos if i.name == "t29old"]
    assert info.status == "incompatible"
    assert info.reason == (
        'declares MINISGL_API = "2.0" but implements minisgl_process_stop (added in API 2.5): declare '
        'MINISGL_API = "2.5", the oldest API with every hook it implements'
    )
    # selecting what it registers names the plugin, its distribution and the fix
    with pytest.raises(PluginError) as selected:
        plugins.resolve("policies", "t29-old")
    assert re.search(
        r"--policy 't29-old' is unavailable: plugin 't29old' \(minisgl-t29old 0.1.0\) is incompatible: "
        r'declares MINISGL_API = "2.0" but implements minisgl_process_stop .*MINISGL_API = "2.5"',
        str(selected.value),
    ), selected.value


def test_the_conformance_kits_build_a_component_that_takes_ctx(install_plugin_module):
    """A third party's suites (cache, policy, parser) build its class as the core does: with a
    context holding the installed plugins' options at their defaults (the kits called ``Cls()``,
    a TypeError for a class taking ctx)."""
    import importlib

    from minisgl_plugin_radix.cache import RadixCache

    from minisgl_core.testing import targets
    from minisgl_core.testing.cache_suite import CacheManagerSuite
    from minisgl_core.testing.policy_suite import SchedulingPolicySuite

    install_plugin_module("minisgl_t29wrap", "minisgl-t29wrap", WRAPPER)
    targets.suite_context.cache_clear()  # (another test's plugins may be cached: this one's are these)
    wrapper = importlib.import_module("minisgl_t29wrap")

    class TestAging(SchedulingPolicySuite):
        policy_cls = wrapper.AgingPolicy

    class TestCounting(CacheManagerSuite):
        cache_cls = wrapper.CountingCache

    try:
        assert TestAging().make_policy().max_wait == 32  # the option's default
        cache = TestCounting().make_cache(page_size=1)
        assert type(cache.inner) is RadixCache and cache.role == "scheduler"
    finally:
        targets.suite_context.cache_clear()


SERVED_POLICY = """
from minisgl_core.api import SchedulingPolicy, hookimpl

MINISGL_API = "2.9"


class Tagged(SchedulingPolicy):
    def __init__(self, ctx):
        # (raises to say what ctx brought: the scheduler's start stops, naming it)
        raise RuntimeError(f"built with tag {ctx.options['t29s_tag']} in {ctx.role} rank {ctx.tp_rank}")

    def schedule(self, state):
        return None


@hookimpl
def minisgl_add_cli_options(parser):
    parser.add_argument("--t29s-tag", default="unset")


@hookimpl
def minisgl_register_policies(register):
    register("t29s", "minisgl_t29s:Tagged")
"""


def test_a_policy_gets_its_option_through_ctx_in_the_scheduler_process(tmp_path, install_plugin_module):
    """(b) under ``serve``: the scheduler process builds the policy with its own context (role,
    rank, the plugin's flag), not only the offline LLM."""
    from minisgl_core.testing.cli_runner import run_cli

    install_plugin_module("minisgl_t29s", "minisgl-t29s", SERVED_POLICY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    args = [
        "serve",
        "--model",
        "demo",
        "--port",
        "0",
        "--device",
        "cpu",
        "--policy",
        "t29s",
        "--t29s-tag",
        "blue",
    ]
    proc = run_cli(args, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: built with tag blue in scheduler rank 0" in proc.stderr, proc.stderr

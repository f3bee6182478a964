"""A plugin that raises at request time is named, with its exception, wherever the failure shows:
a scheduling policy's exception costs nothing (the core plans that step itself, no state had
changed), an attention backend's stops the engine (the step's state is half done) with a
PluginFailure naming the backend, its plugin and its distribution, chained to the original."""

from __future__ import annotations

import logging

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm

PLUGIN = """
from minisgl_core.api import SchedulingPolicy, hookimpl
from minisgl_plugin_naive.cache import NaiveCache
from minisgl_plugin_torch.backend import TorchAttentionBackend

MINISGL_API = "2.0"


class RaisingPolicy(SchedulingPolicy):
    def schedule(self, state):
        raise RuntimeError("the policy exploded on purpose")


class RaisingBackend(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        if not batch.is_prefill:  # past start-up's warm-up (a prefill) and the prompts
            raise RuntimeError("the backend exploded on purpose")
        return super().forward(q, k, v, layer_id, batch)


class RaisingAtStart(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        raise RuntimeError("the backend exploded at start-up")


class RaisingAtInit(SchedulingPolicy):
    def __init__(self):
        raise RuntimeError("the policy's constructor exploded")

    def schedule(self, state):
        return None


class RaisingCache(NaiveCache):
    def match_prefix(self, tokens):
        raise KeyError("the cache exploded on purpose")


class RaisingCacheAtInit(NaiveCache):
    def __init__(self, *, page_size):
        raise ValueError("the cache's constructor exploded")


@hookimpl
def minisgl_register_policies(register):
    register("raising", "minisgl_raising:RaisingPolicy")
    register("raising-init", "minisgl_raising:RaisingAtInit")


@hookimpl
def minisgl_register_caches(register):
    register("raising-init", "minisgl_raising:RaisingCacheAtInit")
    register("raising", "minisgl_raising:RaisingCache")


@hookimpl
def minisgl_register_attention_backends(register):
    register("raising", "minisgl_raising:RaisingBackend")
    register("raising-start", "minisgl_raising:RaisingAtStart")
"""

NAMED = "(plugin 'raising', minisgl-raising 0.1.0)"
PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("m") / "q", "Qwen3ForCausalLM", max_position_embeddings=256)


@pytest.fixture
def plugin_installed(install_plugin_module):
    install_plugin_module("minisgl_raising", "minisgl-raising", PLUGIN)


def test_a_policy_that_raises_costs_no_request(model_dir, plugin_installed, caplog):
    with caplog.at_level(logging.WARNING, logger="minisgl_core.scheduler.scheduler"):
        with cpu_llm(model_dir, policy="raising") as llm:
            outs = llm.generate([[5, 6, 7, 8], [9, 10, 11]], PARAMS)
    assert [len(o.token_ids) for o in outs] == [4, 4]
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(records) == 1, [r.getMessage() for r in records]  # once, not once a step
    message = records[0].getMessage()
    assert message.startswith(
        f"scheduling policy 'raising' {NAMED}: raised RuntimeError: the policy exploded"
    )
    assert records[0].exc_info is not None  # with its traceback


def test_a_backend_that_raises_is_named_and_stops_the_engine(model_dir, plugin_installed, caplog):
    llm = cpu_llm(model_dir, attn="raising")
    with pytest.raises(RuntimeError) as caught, caplog.at_level(logging.ERROR, logger="minisgl_core.llm"):
        llm.generate([[5, 6, 7, 8]], PARAMS)
    # the stopped engine is not asked to take the requests back (that logged a second traceback)
    assert not [r for r in caplog.records if r.name == "minisgl_core.llm"], caplog.text
    assert type(caught.value).__name__ == "PluginFailure"  # a RuntimeError
    assert str(caught.value) == (
        f"attention backend 'raising' {NAMED} failed in RaisingBackend.forward: "
        "RuntimeError: the backend exploded on purpose"
    )
    assert isinstance(caught.value.__cause__, RuntimeError)  # the plugin's own, with its traceback
    # what a server's clients are told: the plugin and where, not the plugin's exception text
    assert caught.value.summary == (
        f"attention backend 'raising' {NAMED} failed in RaisingBackend.forward with RuntimeError"
    )
    # the failed step's prompts were offered to the prefix cache without their KV: no more steps
    with pytest.raises(RuntimeError, match="the backend exploded on purpose"):
        llm.generate([[5, 6, 7, 8]], PARAMS)


@pytest.mark.parametrize("policy", ["prefill-first", "lpm", "priority"])
def test_a_cache_that_raises_under_the_policys_question_is_named_not_the_policy(
    model_dir, plugin_installed, caplog, policy
):
    """The policy asks the cache (``state.cached_prefix_len``): the cache raising there was first
    logged as the policy raising (naming the policy), then failed the step naming the cache."""
    llm = cpu_llm(model_dir, cache="raising", policy=policy)
    with pytest.raises(RuntimeError) as caught, caplog.at_level(logging.WARNING):
        llm.generate([[5, 6, 7, 8]], PARAMS)
    assert type(caught.value).__name__ == "PluginFailure"
    assert str(caught.value) == (
        f"cache 'raising' {NAMED} failed in RaisingCache.match_prefix: "
        "KeyError: 'the cache exploded on purpose'"
    )
    assert not [r for r in caplog.records if "scheduling policy" in r.getMessage()], caplog.text


def test_a_backend_that_raises_at_start_up_is_named(model_dir, plugin_installed):
    """Start-up runs the first forwards (the warm-up prefill; on a GPU the graph captures): a
    backend raising there was a bare RuntimeError from the runner, naming no plugin (offline, and
    "scheduler 0 process failed" under serve), where the same error in a step names it."""
    with pytest.raises(RuntimeError) as caught:
        cpu_llm(model_dir, attn="raising-start")
    assert type(caught.value).__name__ == "PluginFailure"
    assert str(caught.value) == (
        f"attention backend 'raising-start' {NAMED} failed in RaisingAtStart.forward: "
        "RuntimeError: the backend exploded at start-up"
    )


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("policy", "scheduling policy 'raising-init' {named} failed in RaisingAtInit.__init__: "
         "RuntimeError: the policy's constructor exploded"),
        ("cache", "cache 'raising-init' {named} failed in RaisingCacheAtInit.__init__: "
         "ValueError: the cache's constructor exploded"),
    ],
)  # fmt: skip
def test_a_constructor_that_raises_is_named(model_dir, plugin_installed, option, expected):
    """The engine builds the cache and the policy after the model: a constructor raising there
    was the plugin's bare exception (a traceback from the command line, "scheduler 0 process
    failed: RuntimeError" under serve), naming no plugin."""
    with pytest.raises(RuntimeError) as caught:
        cpu_llm(model_dir, **{option: "raising-init"})
    assert type(caught.value).__name__ == "PluginFailure"
    assert str(caught.value) == expected.format(named=NAMED)


WRONG_INIT = """
from minisgl_core.api import SchedulingPolicy, hookimpl
from minisgl_plugin_naive.cache import NaiveCache
from minisgl_plugin_torch.backend import TorchAttentionBackend

MINISGL_API = "2.0"


class Rounds(SchedulingPolicy):
    def __init__(self, rounds):
        self.rounds = rounds

    def schedule(self, state):
        return None


class Capacity(NaiveCache):
    def __init__(self, *, page_size, capacity):
        super().__init__(page_size=page_size)


class Workspace(TorchAttentionBackend):
    def __init__(self, config, workspace_mb):
        super().__init__(config)


@hookimpl
def minisgl_register_policies(register):
    register("wrong-init", "minisgl_wronginit:Rounds")


@hookimpl
def minisgl_register_caches(register):
    register("wrong-init", "minisgl_wronginit:Capacity")


@hookimpl
def minisgl_register_attention_backends(register):
    register("wrong-init", "minisgl_wronginit:Workspace")
"""


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("policy", "but the core builds it as Rounds() and its constructor takes "
         "Rounds(rounds) (missing a required argument: 'rounds'): make Rounds.__init__ accept that "
         "call, any other parameter with a default (docs/plugins.md, SchedulingPolicy)"),
        ("cache", "but the core builds it as Capacity(page_size=...) and its "
         "constructor takes Capacity(*, page_size, capacity) (missing a required argument: 'capacity')"),
        ("attn", "but the core builds it as Workspace(config) and its constructor "
         "takes Workspace(config, workspace_mb) (missing a required argument: 'workspace_mb')"),
    ],
)  # fmt: skip
def test_a_constructor_the_core_cannot_call_is_named_before_the_model_loads(
    model_dir, install_plugin_module, option, expected
):
    """A constructor that raises is named by its frame (above); one whose signature does not take
    the core's call has no frame of the plugin's: it was a bare TypeError (``policy_cls()``,
    ``cls(config)`` in the runner), "scheduler 0 process failed: TypeError" under serve."""
    from minisgl_core.plugins import PluginError

    install_plugin_module("minisgl_wronginit", "minisgl-wronginit", WRONG_INIT)
    with pytest.raises(PluginError) as caught:
        cpu_llm(model_dir, **{option: "wrong-init"})
    message = str(caught.value)
    assert message.startswith("plugin 'wronginit' (minisgl-wronginit 0.1.0) registered minisgl_wronginit:")
    assert f" as {option}='wrong-init', {expected}" in message, message  # (named as the LLM's keyword)


WRONG_RESULTS = """
from minisgl_core.api import hookimpl
from minisgl_plugin_radix.cache import RadixCache
from minisgl_plugin_torch.backend import TorchAttentionBackend

MINISGL_API = "2.0"


class OneHead(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        return super().forward(q, k, v, layer_id, batch)[:, :1]


class NoOutput(TorchAttentionBackend):
    def forward(self, q, k, v, layer_id, batch):
        super().forward(q, k, v, layer_id, batch)


class ListCache(RadixCache):
    def insert_prefix(self, tokens, slots):
        return super().insert_prefix(tokens, slots).tolist()


class TupleCache(RadixCache):
    def match_prefix(self, tokens):
        return tuple(super().match_prefix(tokens))


class PlainSizeCache(RadixCache):
    def size_info(self):
        return tuple(super().size_info())


class HalfSizeCache(RadixCache):
    def size_info(self):
        size = super().size_info()
        return size._replace(evictable=size.evictable / 2)


@hookimpl
def minisgl_register_attention_backends(register):
    register("one-head", "minisgl_wrongresult:OneHead")
    register("no-output", "minisgl_wrongresult:NoOutput")


@hookimpl
def minisgl_register_caches(register):
    register("list", "minisgl_wrongresult:ListCache")
    register("tuple", "minisgl_wrongresult:TupleCache")
    register("plain-size", "minisgl_wrongresult:PlainSizeCache")
    register("half-size", "minisgl_wrongresult:HalfSizeCache")
"""


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        (("attn", "one-head"), "attention backend 'one-head' {named}: OneHead.forward returned a float32 "
         "tensor of shape [1, 1, 16], expected shape [1, 4, 16] (q's)"),
        (("attn", "no-output"), "attention backend 'no-output' {named}: NoOutput.forward returned "
         "NoneType, expected shape [1, 4, 16] (q's)"),
        (("cache", "list"), "cache 'list' {named}: ListCache.insert_prefix returned list, not a 1-D "
         "int64 CPU tensor"),
        (("cache", "tuple"), "cache 'tuple' {named}: TupleCache.match_prefix returned tuple, not a "
         "PrefixMatch"),
        (("cache", "plain-size"), "cache 'plain-size' {named}: PlainSizeCache.size_info returned (0, 0), "
         "not a CacheSize of two non-negative integer token counts"),
        (("cache", "half-size"), "cache 'half-size' {named}: HalfSizeCache.size_info returned "
         "CacheSize(evictable=0.0, protected=0), not a CacheSize of two non-negative integer token counts"),
    ],
)  # fmt: skip
def test_a_result_the_core_cannot_use_is_named(model_dir, install_plugin_module, option, expected):
    """A wrong result has no frame of the plugin's to blame: an attention output of another
    shape failed in the core's reshape ("shape '[1, 256]' is invalid for input of size 64"), a
    list from insert_prefix in the allocator ("'list' object has no attribute 'numel'")."""
    install_plugin_module("minisgl_wrongresult", "minisgl-wrongresult", WRONG_RESULTS)
    with pytest.raises(RuntimeError) as caught:
        with cpu_llm(model_dir, **dict([option])) as llm:  # (a backend's: at start-up's warm-up)
            llm.generate([[5, 6, 7, 8]], PARAMS)
    assert type(caught.value).__name__ == "PluginFailure"
    assert str(caught.value) == expected.format(named="(plugin 'wrongresult', minisgl-wrongresult 0.1.0)")
    assert caught.value.summary == str(caught.value)  # (the core's own words: a server's clients see them)


def test_a_failed_process_is_summed_up_for_clients_without_the_exception_text():
    """The scheduler's report carries what clients may see: the exception's class, and a
    PluginFailure's naming of the plugin; the text (the plugin's own exception, gloo's C++
    paths) stays in the traceback, for the log."""
    from minisgl_core.engine.plugin_failures import PluginFailure
    from minisgl_core.processes.child import _summary

    failure = PluginFailure(
        "attention backend 'x' (plugin 'x', x 1.0) failed in X.forward: RuntimeError: /src/x.cu:12 boom",
        "attention backend 'x' (plugin 'x', x 1.0) failed in X.forward with RuntimeError",
    )
    assert _summary(failure) == (
        "PluginFailure: attention backend 'x' (plugin 'x', x 1.0) failed in X.forward with RuntimeError"
    )
    assert _summary(RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] ...")) == (
        "RuntimeError"
    )
    assert _summary(PluginFailure("no summary given")) == "PluginFailure"


def test_minisgl_generate_says_it_in_one_line(model_dir, plugin_installed, capsys):
    """The command line prints the PluginFailure as one error line (it was a raw traceback), exit
    code 1: not a usage error; the plugin's traceback at --log-level debug."""
    from minisgl_core.cli import main

    argv = f"generate --model {model_dir} --device cpu --attn raising --max-tokens 3 --num-kv-tokens 512"
    assert main([*argv.split(), "hello"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"minisgl: error: attention backend 'raising' {NAMED} failed in RaisingBackend.forward: "
        "RuntimeError: the backend exploded on purpose (its traceback: --log-level debug)"
    ), err
    assert not any(line.startswith("Traceback") for line in err), err


@pytest.mark.parametrize(
    "value, count",
    [
        (0, 0),
        (7, 7),
        ("numpy", 5),
        (True, None),
        (False, None),
        (-1, None),
        (2.0, None),
        ("3", None),
        (None, None),
    ],
)
def test_a_cache_size_count_is_a_non_negative_integer(value, count):
    """What ``KVManager.size_info`` takes as a token count: an int or a numpy int, not a bool (an
    int subclass), a float, a string or a negative number."""
    import numpy as np

    from minisgl_core.scheduler.kv import _count

    assert _count(np.int64(5) if value == "numpy" else value) == count

"""One request path: admission decides and checks once, the prefix cache is searched once per
admission, and the engine lands a step in flight before a retraction without the scheduler
calling back into it."""

from __future__ import annotations

import random

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.plugins import Plugins
from minisgl_core.scheduler.allocator import PageAllocator
from minisgl_core.scheduler.kv import KVManager
from minisgl_core.scheduler.request import Request
from minisgl_core.testing import cpu_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=512
    )


# ------------------------------------------------------------------------ one match per admission


@pytest.mark.parametrize("policy", ["prefill-first", "lpm", "priority"])
def test_each_admission_searches_the_cache_once(model_dir, policy):
    """The policy asks how much of each waiting prompt is cached, and the admission locks that
    very match: one match_prefix of the prompt per admitted request, cold and warm."""
    rng = random.Random(1)
    shared = [rng.randrange(5, 1000) for _ in range(21)]
    # lengths that are not whole pages, so the prompt offered to the cache after prefill (whole
    # pages only) is never the prompt itself
    prompts = [shared + [rng.randrange(5, 1000) for _ in range(4 * i + 2)] for i in range(5)]
    with cpu_llm(model_dir, page_size=4, policy=policy) as llm:
        cache = llm.engine.scheduler.kv.cache
        searched: list[tuple[int, ...]] = []
        match_prefix = cache.match_prefix

        def counting(tokens):
            searched.append(tuple(tokens))
            return match_prefix(tokens)

        cache.match_prefix = counting
        expected = {tuple(p): 1 for p in prompts}
        for _ in range(2):  # cold, then every prompt's prefix is cached
            searched.clear()
            outs = llm.generate(prompts, GREEDY)
            assert all(len(o.token_ids) == 6 for o in outs)
            of_prompts = [t for t in searched if t in expected]
            assert {t: of_prompts.count(t) for t in expected} == expected
        assert llm.engine.stats()["cached_prompt_tokens"] >= len(prompts) * 20


def _request(rid: int, prompt: list[int]) -> Request:
    return Request(rid=rid, prompt_ids=prompt, params=SamplingParams(max_tokens=4), arrival=rid)


def test_a_remembered_match_is_dropped_when_the_cache_changes():
    cache = Plugins.load().resolve("caches", "radix")(page_size=1)
    kv = KVManager(PageAllocator(64, 1), cache, 1)
    waiting = _request(0, [1, 2, 3, 4, 5])
    assert kv.cached_prefix_len(waiting) == 0  # nothing cached yet; the match is remembered
    # another request finishes and gives its KV to the cache: the remembered match is stale
    other = _request(1, [1, 2, 3, 4, 9])
    assert kv.admit(other)
    other.row = 1  # what the scheduler gives an admitted request
    assert kv.allocate(other, 5) is not None
    other.num_computed = 5
    kv.release(other)
    assert kv.cached_prefix_len(waiting) == 4
    assert kv.admit(waiting) and waiting.prefix_len == 4 and waiting.num_computed == 4
    waiting.row = 0
    kv.release(waiting)
    cache.check_integrity()


# ------------------------------------------------------------------------ admission decides once


def test_admission_decides_max_tokens_and_the_engine_trusts_it(model_dir):
    with cpu_llm(model_dir, num_kv_tokens=256) as llm:
        rest = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
        admitted = llm.engine.admit([5] * 200, rest)
        assert admitted.max_tokens == 256 - 200 and rest.max_tokens is None  # frozen: a new object
        with pytest.raises(ValueError, match="no room for output"):
            llm.engine.admit([5] * 256, rest)
        with pytest.raises(ValueError, match="admit the request first"):
            llm.engine.add_request(0, [5, 6], rest)
        # offline, max_tokens=None runs to the end of what the pool holds
        out = llm.generate([[5] * 250], rest)[0]
        assert len(out.token_ids) == 6 and out.finish_reason == "length"


# ------------------------------------------------------------------------ no callback into the engine


@pytest.mark.parametrize("signal", [True, False], ids=["signalled", "signal-suppressed"])
def test_the_step_in_flight_lands_before_any_retraction(model_dir, signal):
    """With overlap, the engine asks the scheduler whether decode may retract and lands the step
    in flight first, so every retraction happens with nothing in flight and keeps every token.
    Suppressing the signal (the control) leaves steps in flight at retractions."""
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 1000) for _ in range(30)] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    with cpu_llm(model_dir, num_kv_tokens=256) as llm:
        engine = llm.engine
        kv = engine.scheduler.kv
        in_flight_at_retraction: list[bool] = []
        retracted = kv.retracted

        def recording():
            in_flight_at_retraction.append(engine._inflight is not None)
            retracted()

        kv.retracted = recording
        if not signal:
            engine.scheduler.decode_may_retract = lambda: False
        outs = llm.generate(prompts, params)
        assert in_flight_at_retraction
        if signal:
            assert not any(in_flight_at_retraction)
            with cpu_llm(model_dir, cache="naive") as alone:
                expected = [alone.generate([p], params)[0].token_ids for p in prompts]
            assert [o.token_ids for o in outs] == expected
        else:
            assert any(in_flight_at_retraction)

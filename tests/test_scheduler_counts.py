"""The scheduler's counts of live requests by kind, kept as requests arrive and leave (the engine
asks every step instead of scanning hundreds of requests): after any sequence of arrivals, steps
(prefills, decodes, finishes, retractions under a small KV pool) and aborts, each equals a recount."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minisgl_core import SamplingParams
from minisgl_core.api import GrammarSpec
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm

KINDS = {
    "plain": {},
    "penalty": {"presence_penalty": 0.5},
    "min_tokens": {"min_tokens": 2},
    "grammar": {"grammar": GrammarSpec("json_object", "")},
}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(sorted(KINDS)), st.integers(2, 12)),
        st.tuples(st.just("abort"), st.integers(0, 30)),
        st.tuples(st.just("step"), st.integers(1, 4)),
    ),
    max_size=25,
)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    model = make_model_dir(tmp_path_factory.mktemp("m") / "qwen3", num_hidden_layers=1, intermediate_size=64)
    # a pool of 8 pages: decodes run out of pages and retract requests
    made = cpu_llm(model, cache="radix", num_kv_tokens=128, page_size=16, overlap=True, mixed_batch=True)
    yield made
    made.close()


def recount(scheduler) -> tuple[int, int]:
    live = [*scheduler.waiting.values(), *scheduler.running.values()]
    return (
        sum(r.needs_host_outputs for r in live),
        sum(r.params.grammar is not None for r in live),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_live_request_counts_equal_a_recount(llm, ops):
    engine = llm.engine
    scheduler = engine.scheduler
    next_rid = 1_000_000 * (1 + scheduler._arrivals)  # (rids unique across examples)
    for op in ops:
        if op[0] == "add":
            _, kind, max_tokens = op
            params = SamplingParams(temperature=1.0, seed=next_rid, max_tokens=max_tokens, **KINDS[kind])
            prompt = [1 + (next_rid + i) % 50 for i in range(3 + next_rid % 20)]
            engine.add_request(next_rid, prompt, engine.admit(prompt, params))
            next_rid += 1
        elif op[0] == "abort":
            live = [*scheduler.waiting, *scheduler.running]
            if live:
                engine.abort(live[op[1] % len(live)])
        else:
            for _ in range(op[1]):
                engine.step()
        assert (scheduler.host_output_requests, scheduler.grammar_requests) == recount(scheduler)
    while engine.has_work:
        engine.step()
    assert (scheduler.host_output_requests, scheduler.grammar_requests) == (0, 0)

"""The KV pool under pressure from requests the admission let in: nothing hangs, nothing fails.

Two ways a small pool used to stop accepted requests, both found by a stress run of the server:
a decode that needed a page while a prompt admitted after it held the pool's last pages in a
partly prefilled state (the scheduler raised, and the server went down), and a prompt whose
cached prefix, locked by its own admission, could never be counted as room (it waited forever).
"""

from __future__ import annotations

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import assert_kv_released, cpu_llm

#: more steps than any of these runs needs: reaching it means a request never finished
STEP_LIMIT = 3000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024
    )


def run_bounded(
    engine, scores: dict | None = None, until=lambda: False, cached: dict | None = None
) -> dict[int, list[int]]:
    """Step until nothing is left (or ``until()``), each request's tokens (and into ``scores`` its
    prompt logprobs, where it asked for them; into ``cached`` its prompt tokens read from the
    prefix cache); fails past STEP_LIMIT."""
    tokens: dict[int, list[int]] = {}
    for _ in range(STEP_LIMIT):
        if not engine.has_work or until():
            return tokens
        for out in engine.step():
            if out.token_id >= 0:
                tokens.setdefault(out.rid, []).append(out.token_id)
            if cached is not None and out.cached_tokens is not None:
                assert out.rid not in cached, "cached tokens sent twice"
                cached[out.rid] = out.cached_tokens
            if scores is not None and out.prompt_logprobs is not None:
                assert out.rid not in scores, "prompt logprobs sent twice"
                scores[out.rid] = out.prompt_logprobs
    raise AssertionError(f"requests still unfinished after {STEP_LIMIT} steps: {engine.stats()}")


def alone(model_dir, prompt: list[int], params: SamplingParams):
    llm = cpu_llm(model_dir, cache="naive")
    [out] = llm.generate([prompt], params, use_tqdm=False)
    llm.close()
    return out


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize("scored", [False, True], ids=["plain", "prompt-logprobs"])
def test_a_decode_takes_back_the_pages_of_a_prompt_admitted_after_it(model_dir, overlap, scored):
    """A long decode has run long enough that admission expects little more of it (the reserve
    ratio at its floor); a prompt admitted then is prefilled one token a mixed step beside it, and
    the two exhaust the pool before either finishes. The partly prefilled prompt gives its pages
    back (its computed part to the prefix cache) and is admitted again later: both finish, with
    the tokens (and a scored prompt's logprobs, each position scored once) each gets alone.
    (Prefill and decode steps taking turns instead, prefill-first prefills the prompt whole before
    the decode grows again: that never ran out.) Nothing of the prompt came from another
    request: its cached tokens are 0."""
    long = SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True)
    short = SamplingParams(
        temperature=0.0, max_tokens=1, ignore_eos=True, prompt_logprobs=1 if scored else None
    )
    prompt_a, prompt_b = [5, 6, 7, 8], list(range(10, 130))
    llm = cpu_llm(
        model_dir, cache="radix", num_kv_tokens=512, max_prefill_tokens=2, overlap=overlap, mixed_batch=True
    )
    engine = llm.engine
    engine.add_request(0, prompt_a, long)
    running = engine.scheduler.running
    scores: dict[int, list] = {}
    tokens = run_bounded(engine, until=lambda: 0 in running and running[0].num_computed >= 330)
    engine.add_request(1, prompt_b, short)
    cached: dict[int, int] = {}
    for rid, more in run_bounded(engine, scores, cached=cached).items():
        tokens.setdefault(rid, []).extend(more)
    assert cached == {1: 0}
    assert tokens[0] == alone(model_dir, prompt_a, long).token_ids
    reference = alone(model_dir, prompt_b, short)
    assert tokens[1] == reference.token_ids
    if scored:
        assert [p and p.token_id for p in scores[1]] == [None, *prompt_b[1:]]
        got = [p.logprob for p in scores[1][1:]]
        assert got == pytest.approx([p.logprob for p in reference.prompt_logprobs[1:]], abs=1e-4)
    assert engine.stats()["retractions"] >= 1  # the test can tell: the pool did run out
    assert_kv_released(llm)
    engine.scheduler.kv.cache.check_integrity()
    llm.close()


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=1),
    ],
    ids=["prompt-logprobs", "plain"],
)
def test_a_prompt_cached_whole_is_admitted_when_the_pool_holds_little_else(model_dir, page_size, params):
    """The same prompt twice, the second time wholly in the prefix cache, with the pool only just
    large enough for prompt + output. The second must not count the cached tokens it will not
    read (the last prompt token, run again for its logits; every token when it scores the prompt)
    as locked room: they are evictable, and it is admitted."""
    pool = 256
    prompt = [(7 * i) % 1000 + 5 for i in range(pool - page_size)]  # ends on a page: its last is run again
    llm = cpu_llm(model_dir, cache="radix", num_kv_tokens=pool, page_size=page_size)
    engine = llm.engine
    first = second = None
    for rid in (0, 1):
        engine.add_request(rid, prompt, params)
        tokens = run_bounded(engine)
        first, second = (tokens[rid], second) if rid == 0 else (first, tokens[rid])
    assert second == first == alone(model_dir, prompt, params).token_ids
    assert_kv_released(llm)
    engine.scheduler.kv.cache.check_integrity()
    llm.close()

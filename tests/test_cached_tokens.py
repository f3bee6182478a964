"""Each request's prompt tokens read from the prefix cache (``StepOutput.cached_tokens``, the
offline ``RequestOutput.num_cached_tokens``, the API's ``cached_tokens``): reported with its first
output, counting what it read and never computed itself."""

from __future__ import annotations

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm, drain

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024
    )


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_the_first_output_says_how_much_of_the_prompt_the_cache_held(model_dir, overlap):
    """The same prompt twice: nothing cached the first time; the second reads all but the last
    token (page size 1 on the CPU; one token must run for the first logits). Only the first output
    of a request carries the figure; chunked prefill (4 tokens a step) changes nothing."""
    llm = cpu_llm(model_dir, cache="radix", max_prefill_tokens=4, overlap=overlap)
    prompt = list(range(20, 50))
    figures = []
    for rid in (0, 1):
        llm.engine.add_request(rid, prompt, GREEDY)
        outputs = [o for o in drain(llm.engine) if o.rid == rid]
        assert len(outputs) == GREEDY.max_tokens
        assert all(o.cached_tokens is None for o in outputs[1:])
        figures.append(outputs[0].cached_tokens)
    assert figures == [0, len(prompt) - 1]
    llm.close()


def test_offline_outputs_count_a_prompt_once_whatever_n(model_dir):
    """``num_cached_tokens`` counts the prompt as the usage's prompt_tokens does, once: the least
    of its choices' figures. A new prompt with n = 3 reads nothing (its first choice computed it,
    the others read that): 0, not the others' hits; the same prompt again: all but its last token."""
    llm = cpu_llm(model_dir, cache="radix")
    prompt = list(range(60, 90))
    params = SamplingParams(temperature=1.0, max_tokens=2, n=3, seed=1)
    [first] = llm.generate([prompt], params, use_tqdm=False)
    [again] = llm.generate([prompt], params, use_tqdm=False)
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, len(prompt) - 1)
    llm.close()


def test_nothing_is_cached_without_prefix_reuse_or_with_prompt_logprobs(model_dir):
    """The naive cache reuses nothing; a request scoring its prompt computes it whole."""
    naive = cpu_llm(model_dir, cache="naive")
    prompt = list(range(100, 130))
    assert [naive.generate([prompt], GREEDY, use_tqdm=False)[0].num_cached_tokens for _ in range(2)] == [0, 0]
    naive.close()
    radix = cpu_llm(model_dir, cache="radix")
    radix.generate([prompt], GREEDY, use_tqdm=False)
    scored = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=1)
    assert radix.generate([prompt], scored, use_tqdm=False)[0].num_cached_tokens == 0
    radix.close()


def test_a_prompt_given_back_mid_prefill_reads_its_own_part_again_which_is_no_hit(model_dir, monkeypatch):
    """A prompt partly prefilled when decode runs out of pages gives them back (its computed part
    to the prefix cache) and is admitted again later, reading that part from the cache: its own
    work, not a hit. Its cached tokens stay what its first admission found, 0. (The pool is made
    to look full for the one call that gives the prompt back.)"""
    llm = cpu_llm(model_dir, cache="radix", max_prefill_tokens=4, overlap=False, mixed_batch=True)
    engine, scheduler = llm.engine, llm.engine.scheduler
    engine.add_request(0, [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    while 0 not in scheduler.running:
        engine.step()
    engine.add_request(1, list(range(200, 240)), GREEDY)
    outputs = engine.step()  # request 0's token beside request 1's first chunk
    given_back = scheduler.waiting[1]
    assert given_back.admitted and 0 < given_back.num_computed < given_back.prompt_len
    with monkeypatch.context() as patched:
        patched.setattr(scheduler.kv, "obtainable_pages", lambda: 0)
        scheduler._retract_until_decode_fits([scheduler.running[0]])
    assert not given_back.admitted and scheduler.kv.cached_prefix_len(given_back) > 0
    outputs += drain(engine)
    assert {o.rid: o.cached_tokens for o in outputs if o.cached_tokens is not None} == {1: 0}
    llm.close()


def test_reset_prefix_cache_empties_the_cache_but_not_under_a_running_request(model_dir):
    """vLLM's ``LLM.reset_prefix_cache``: the prompt cached before it is computed whole after it,
    to the same greedy tokens; the engine refuses (None, nothing evicted) while a request runs."""
    llm = cpu_llm(model_dir, cache="radix")
    prompt = list(range(200, 230))
    first, again = (llm.generate([prompt], GREEDY, use_tqdm=False)[0] for _ in range(2))
    assert (first.num_cached_tokens, again.num_cached_tokens) == (0, len(prompt) - 1)
    assert llm.reset_prefix_cache() is True
    assert llm.engine.scheduler.kv.size_info() == (0, 0)
    after = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0
    assert after.outputs[0].token_ids == first.outputs[0].token_ids == again.outputs[0].token_ids
    held = llm.engine.scheduler.kv.size_info().evictable
    llm.engine.add_request(7, prompt, GREEDY)
    assert llm.engine.flush_cache() is None and llm.engine.scheduler.kv.size_info().evictable == held
    drain(llm.engine)
    assert llm.engine.flush_cache() == held > 0
    llm.close()

"""vLLM's ``cache_salt``: a request shares prefix-cache entries only with requests of the same salt
(one a tenant: a client cannot learn from the speed of its answers what another tenant asked).
Offline through vLLM's prompt dicts, served on chat, completions and responses."""

from __future__ import annotations

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.request_limits import cache_salt_key
from minisgl_core.scheduler.request import Request
from minisgl_core.testing import cpu_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
PROMPT = list(range(20, 60))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=1024
    )


def salted(salt: str | None, prompt: list[int] = PROMPT) -> dict:
    return {"prompt_token_ids": prompt} if salt is None else {"prompt_token_ids": prompt, "cache_salt": salt}


@pytest.mark.parametrize("page_size", [1, 4])
def test_only_requests_of_one_salt_share_the_cache(model_dir, page_size):
    """The same prompt run again reads all but its last token from the cache: only under the same
    salt (or with no salt both times); under another salt, or salted after unsalted, nothing. The
    greedy tokens are the same every time, and the cache stays consistent."""
    llm = cpu_llm(model_dir, cache="radix", page_size=page_size)
    hit = (len(PROMPT) - 1) // page_size * page_size

    def run(salt):
        [out] = llm.generate([salted(salt)], GREEDY, use_tqdm=False)
        return out.num_cached_tokens, out.outputs[0].token_ids

    first, tokens = run("tenant-a")
    assert first == 0
    assert run("tenant-a") == (hit, tokens)
    assert run("tenant-b") == (0, tokens)
    assert run(None) == (0, tokens)
    assert run(None) == (hit, tokens)
    assert run("tenant-b") == (hit, tokens)
    llm.engine.scheduler.kv.cache.check_integrity()
    llm.close()


def test_a_burst_shares_a_prompt_only_within_one_salt(model_dir):
    """Requests arriving together behind one prompt read it from the first one's prefill (one not
    yet admitted waits a round for it): within a salt, not across salts."""
    llm = cpu_llm(model_dir, cache="radix", max_prefill_tokens=16)
    prompt = list(range(100, 160))
    outs = llm.generate(
        [salted("a", prompt), salted("a", prompt), salted("b", prompt)], GREEDY, use_tqdm=False
    )
    assert outs[0].num_cached_tokens == 0 and outs[1].num_cached_tokens > 0, [
        o.num_cached_tokens for o in outs
    ]
    assert outs[2].num_cached_tokens == 0
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
    llm.close()


def test_a_request_of_another_salt_does_not_wait_for_a_prompt_it_cannot_read(model_dir):
    """The wait a round for a prompt being prefilled is for requests that will read it: one of
    another salt starts at once, in the first step with the first request."""
    llm = cpu_llm(model_dir, cache="radix", max_prefill_tokens=512)
    engine = llm.engine
    prompt = list(range(200, 260))
    for rid, salt in ((0, "a"), (1, "a"), (2, "b")):
        engine.add_request(rid, prompt, GREEDY, cache_salt=cache_salt_key(salt))
    engine.step()
    started = {rid for rid, req in engine.scheduler.running.items() if req.num_computed > 0}
    assert started == {0, 2}, started
    while engine.has_work:
        engine.step()
    llm.close()


def test_the_salted_key_never_equals_a_token_nor_another_salts():
    keys = [cache_salt_key(s) for s in ("a", "b", "tenant-1", "tenant-2", "x" * 1024)]
    assert len(set(keys)) == len(keys) and all(0 < k < 2**62 for k in keys)
    assert cache_salt_key("a") == cache_salt_key("a")  # (every TP rank and process alike)
    firsts = set()
    for key in keys:
        request = Request(rid=0, prompt_ids=[5, 6, 7], params=GREEDY, arrival=0, cache_salt=key)
        salted_key = request.cache_key([5, 6, 7])
        assert salted_key[0] < 0 and salted_key[1:] == [6, 7]
        firsts.add(salted_key[0])
    assert len(firsts) == len(keys)
    plain = Request(rid=0, prompt_ids=[5, 6, 7], params=GREEDY, arrival=0)
    assert plain.cache_key([5, 6, 7]) == [5, 6, 7] and plain.cache_key([]) == []


@pytest.mark.parametrize("salt", ["", 5, "x" * 1025])
def test_a_bad_offline_salt_is_refused_naming_it(model_dir, salt):
    llm = cpu_llm(model_dir, cache="radix")
    with pytest.raises(TypeError, match="'cache_salt' must be a str of 1 to 1024 characters"):
        llm.generate([{"prompt_token_ids": PROMPT, "cache_salt": salt}], GREEDY, use_tqdm=False)
    llm.close()

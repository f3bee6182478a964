"""What a decode step reuses from the step before while it samples the same requests: the
engine's SampleRequests (one tuple, as long as no request has constraints of its own) and the
sampler's answers about that tuple; a request whose bans follow its output gets them anew a step."""

from __future__ import annotations

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import cpu_llm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("m") / "qwen3", num_hidden_layers=1, intermediate_size=64)


def launched_samples(engine, steps: int) -> list[tuple]:
    """What the sampler is handed (the rows' SampleRequests) at each of the next ``steps`` decode
    steps."""
    seen = []
    sample = engine.sampler.sample

    def recording(logits, requests, grammar_mask=None):
        seen.append(requests)
        return sample(logits, requests, grammar_mask)

    engine.sampler.sample = recording
    try:
        for _ in range(steps):
            engine.step()
            assert engine.launched_last is not None and engine.launched_last.kind == "decode"
    finally:
        del engine.sampler.sample
    return seen


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_steps_of_the_same_requests_share_one_tuple_of_samples(model_dir, overlap):
    llm = cpu_llm(model_dir, overlap=overlap)
    engine = llm.engine
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    drawn = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True, seed=3)
    for rid, params in enumerate([greedy, drawn, greedy]):
        prompt = [1 + rid, 2, 3, 4]
        engine.add_request(rid, prompt, engine.admit(prompt, params))
    while engine.scheduler.waiting or engine.launched_last.kind != "decode":
        engine.step()
    first, second = launched_samples(engine, 2)
    assert second is first and len(first) == 3
    # the sampler answers once for the tuple (plain rows, not all greedy, none truncated) and
    # copies the race's scales once: row 1 draws from its own generator
    assert engine.sampler._kinds_memo == (first, (True, False, False))
    assert engine.sampler._race_memo[0] is first and engine.sampler._race_memo[3] == [1]
    while len(engine.scheduler.running) == 3:  # request 1 finishes first: a new tuple, without it
        engine.step()
    [after] = launched_samples(engine, 1)
    assert after is not first and [s.params for s in after] == [greedy, greedy]
    assert after == tuple(engine.scheduler.running[rid].sample_request() for rid in (0, 2))
    llm.close()


def test_a_request_whose_bans_follow_its_output_gets_new_samples_each_step(model_dir):
    """min_tokens bans the stop tokens until the output is that long: the samples of each step are
    made again (the ban is lifted at the step where the output reaches min_tokens)."""
    llm = cpu_llm(model_dir, overlap=False)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=8, min_tokens=4)
    engine.add_request(0, [5, 6, 7], engine.admit([5, 6, 7], params))
    engine.add_request(1, [5, 6, 8], engine.admit([5, 6, 8], SamplingParams(temperature=0.0, max_tokens=8)))
    while engine.scheduler.waiting:
        engine.step()
    req = engine.scheduler.running[0]
    steps = launched_samples(engine, 4)
    assert len({id(s) for s in steps}) == 4
    bans = [bool(s[0].banned) for s in steps]
    # (launched with 1, 2, 3 and 4 tokens out: banned while fewer than min_tokens)
    assert bans == [True, True, True, False], (bans, len(req.output_ids))
    llm.close()


def test_a_seeded_request_draws_alike_alone_and_among_requests_that_come_and_go(model_dir):
    """Its tokens do not depend on the batch, while requests before it in the batch finish (its
    row moves: the reused samples and scales must follow) and others join."""
    llm = cpu_llm(model_dir)
    seeded = SamplingParams(temperature=0.9, max_tokens=16, ignore_eos=True, seed=11)
    [alone] = llm.generate([[3, 4, 5]], seeded, use_tqdm=False)
    prompts = [[7, 8], [9, 10, 11], [3, 4, 5], [12, 13]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
        SamplingParams(temperature=0.7, max_tokens=7, ignore_eos=True),
        seeded,
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert outs[2].token_ids == alone.token_ids
    llm.close()

"""OpenAI's Predicted Outputs in the engine: a request's prediction is a source of drafts for the
n-gram drafter, the output is the one without it, and the prediction tokens the output used are
counted (StepOutput.accepted_prediction_tokens). The server's side: tests/server/test_predicted_outputs.py."""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.scheduler import speculative
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.speculative import NgramDrafter
from minisgl_core.testing import assert_kv_released, cpu_llm, drain

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
SPEC = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4)

# ------------------------------------------------------------------ the drafter


def request(prompt: list[int], output: list[int], prediction: list[int] | None) -> Request:
    return Request(
        rid=0,
        prompt_ids=list(prompt),
        params=SamplingParams(max_tokens=100),
        arrival=0,
        output_ids=list(output),
        prediction_ids=prediction,
    )


def brute_force(tokens: list[int], prediction: list[int], cursor: int, k: int, max_n: int, min_n: int):
    """The longest suffix (max_n..min_n) found in the prediction or earlier in the tokens, the
    prediction's match first at equal lengths: in the prediction the tokens after its first
    occurrence ending at or after ``cursor`` (else its last), in the tokens after its latest."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if length < n:
            continue
        suffix = tokens[length - n :]
        ends = [e for e in range(n, len(prediction)) if prediction[e - n : e] == suffix]
        if ends:
            end = next((e for e in ends if e >= cursor), ends[-1])
            return prediction[end : end + k]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 5), min_size=1, max_size=20),
    output=st.lists(st.integers(0, 5), max_size=30),
    prediction=st.lists(st.integers(0, 5), max_size=30),
    k=st.integers(1, 6),
    sizes=st.sampled_from([(4, 1), (3, 2), (1, 1)]),
)
def test_lookup_in_the_prediction_matches_brute_force(prompt, output, prediction, k, sizes):
    max_n, min_n = sizes
    drafter = NgramDrafter(max_n, min_n)
    req = request(prompt, [], prediction)
    for token in [None, *output]:  # asked after every token, the indexes grow incrementally
        if token is not None:
            req.output_ids.append(token)
        [draft] = drafter.propose([req], [k])
        assert draft == brute_force(req.all_ids(), prediction, 0, k, max_n, min_n)


@settings(max_examples=100, deadline=None)
@given(
    prediction=st.lists(st.integers(0, 4), max_size=40),
    output=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    chunk=st.integers(1, 7),
)
def test_a_prediction_indexed_a_chunk_a_step_finds_what_indexing_it_whole_finds(prediction, output, chunk):
    """A long prediction is indexed a chunk of positions a lookup (the first lookup of an
    8,000-token one held the scheduler up for the whole): across the chunks' borders the index is
    the one built whole, as the lookups show once the prediction is covered."""
    req = request([9], output, prediction)
    with mock.patch.object(speculative, "_PREDICTION_CHUNK", chunk):
        drafter = NgramDrafter(3, 1)
        for _ in range(len(prediction) // chunk + 1):
            drafter.propose([req], [3])
    assert drafter.propose([req], [3]) == [brute_force(req.all_ids(), prediction, 0, 3, 3, 1)]


def test_the_longest_match_wins_and_the_prediction_at_equal_lengths():
    drafter = NgramDrafter(3, 1)
    # the prompt has [1, 2, 3] (followed by 4 5 6); the prediction only [3] (followed by 9 9)
    req = request([1, 2, 3, 4, 5, 6, 7, 1, 2], [3], [3, 9, 9])
    assert drafter.propose([req], [3]) == [[4, 5, 6]]
    # both have [2, 3]: the prediction's continuation
    req = request([2, 3, 4, 5, 6, 2], [3], [8, 2, 3, 9, 9])
    assert drafter.propose([req], [3]) == [[9, 9]]


def test_a_repeated_line_of_the_prediction_continues_where_the_output_is():
    drafter = NgramDrafter(2, 1)
    line = [7, 8, 9]
    prediction = [*line, 1, *line, 2, *line, 3]
    req = request([50], [7], prediction)
    assert drafter.propose([req], [4]) == [[8, 9, 1, 7]]
    # all four taken and the target's own token is the prediction's next: five used
    assert drafter.verified(req, [8, 9, 1, 7], [8, 9, 1, 7, 8]) == 5
    req.output_ids += [8, 9, 1, 7, 8]
    # [7, 8] occurs three times: the occurrence after the point reached, not the first or last
    assert drafter.propose([req], [4]) == [[9, 2, 7, 8]]
    # the second draft rejected: 9 used, then the target's 5 differs from the prediction's 2
    assert drafter.verified(req, [9, 2, 7, 8], [9, 5]) == 1
    req.output_ids += [9, 5]
    assert drafter.propose([req], [4]) == [[]]  # [9, 5] and [5] are nowhere
    assert drafter.verified(req, [], [6]) == 0


def test_each_prediction_token_counts_once():
    drafter = NgramDrafter(1, 1)
    req = request([50], [1], [1, 2, 3, 1, 2, 3])
    assert drafter.propose([req], [2]) == [[2, 3]]
    assert drafter.verified(req, [2, 3], [2, 3, 1]) == 3
    req.output_ids += [2, 3, 1]
    # the output starts the prediction's text again: the drafter proposes from its latest
    # occurrence, whose tokens were not used yet
    assert drafter.propose([req], [2]) == [[2, 3]]
    assert drafter.verified(req, [2, 3], [2, 3]) == 2
    req.output_ids += [2, 3]
    assert drafter.propose([req], [2]) == [[1, 2]]  # (no [3] at or past the cursor: its last one)
    assert drafter.verified(req, [1, 2], [1, 2, 3]) == 0  # all six used already


# ------------------------------------------------------------------ the engine, tiny model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM", max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def spec_llm(model_dir):
    llm = cpu_llm(model_dir, cache="naive", **SPEC)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def prompt():
    rng = random.Random(3)
    return [rng.randrange(5, 1000) for _ in range(17)]


@pytest.fixture(scope="module")
def reference(model_dir, prompt):
    plain = cpu_llm(model_dir, cache="naive")
    try:
        return plain.generate([prompt], GREEDY)[0].token_ids
    finally:
        plain.close()


def run(llm, prompt: list[int], prediction: list[int] | None) -> tuple[list[int], int, dict[str, int]]:
    """(the greedy output, the prediction tokens it used, the verify counters of the run)."""
    engine = llm.engine
    before = engine.stats()
    engine.add_request(0, prompt, GREEDY, prediction_ids=prediction)
    outputs = drain(engine)
    after = engine.stats()
    assert_kv_released(llm)
    tokens = [o.token_id for o in outputs if o.rid == 0]
    used = sum(o.accepted_prediction_tokens or 0 for o in outputs)
    return tokens, used, {k: after[k] - before[k] for k in after if k.startswith("spec_")}


def test_the_output_with_a_prediction_is_the_output_without(spec_llm, prompt, reference):
    unrelated = [1, 2, 3, 4] * 10  # (ids the output never has: the random prompt's are >= 5)
    assert not set(unrelated) & set(reference)
    partly = reference[:15] + [1, 2, 3] + reference[18:]
    for prediction in (reference, partly, unrelated, reference[::-1], [], None):
        tokens, used, _ = run(spec_llm, prompt, prediction)
        assert tokens == reference, prediction
        assert 0 <= used <= len(prediction or ())
    assert run(spec_llm, prompt, unrelated)[1] == 0


def test_an_exact_prediction_is_used_whole_in_fewer_steps(spec_llm, prompt, reference):
    tokens, used, spec = run(spec_llm, prompt, reference)
    _, _, alone = run(spec_llm, prompt, None)
    assert tokens == reference
    # every token but the prefill's: each verify step takes its four drafts and the target's own
    # token, which goes on with the prediction
    assert used == len(reference) - 1
    assert spec["spec_accepted_tokens"] == spec["spec_draft_tokens"]
    assert spec["spec_verify_steps"] == -(-(len(reference) - 1) // 5)
    # the model's forwards after the prefill, with the prediction and without
    assert (
        len(reference) - 1 - spec["spec_accepted_tokens"] < len(reference) - 1 - alone["spec_accepted_tokens"]
    )


def test_a_partly_right_prediction_counts_what_the_output_used(spec_llm, prompt, reference):
    partly = reference[:20] + [1, 2]  # the first 20 tokens, then a wrong guess
    tokens, used, _ = run(spec_llm, prompt, partly)
    assert tokens == reference
    assert used == 19  # all of the right part but the first token (the prefill's)

"""vLLM's allowed_token_ids and bad_words: validation, admission (the bad words tokenized once),
the sampler's mask and bans, and what the engine then generates."""

from __future__ import annotations

import msgpack
import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.messages import Limits
from minisgl_core.request_limits import MAX_BAD_WORDS_TOKENS, admit, bad_words_token_ids
from minisgl_core.runner.sampler import Sampler, SampleRequest
from minisgl_core.testing import cpu_llm
from minisgl_core.token_bans import bad_words_ban, no_token_left, no_token_left_field, step_bans

PROMPT = [11, 12, 13, 14, 200, 300]
LIMITS = Limits(256, 256, 2000)

# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("allowed_token_ids", []),
        ("allowed_token_ids", [-1]),
        ("allowed_token_ids", [2**63]),
        ("allowed_token_ids", [1.5]),
        ("allowed_token_ids", [True]),
        ("allowed_token_ids", "12"),
        ("allowed_token_ids", {1, 2}),
        ("allowed_token_ids", [0] * (SamplingParams.MAX_ALLOWED_TOKEN_IDS + 1)),
        ("bad_words", [""]),
        ("bad_words", ["  "]),
        ("bad_words", [3]),
        ("bad_words", 3),
        ("bad_words", ["a\udfff"]),
        ("bad_words", ["w"] * (SamplingParams.MAX_BAD_WORDS + 1)),
        ("bad_words", ["w" * (SamplingParams.MAX_BAD_WORD_CHARS + 1)]),
        ("bad_words_token_ids", [[]]),
        ("bad_words_token_ids", [[-1]]),
    ],
)
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}"):
        SamplingParams(**{field: value})


def test_values_are_normalised_and_cross_the_wire():
    params = SamplingParams(allowed_token_ids=[9, 3, 9, 5], bad_words="hello")
    assert params.allowed_token_ids == (3, 5, 9)  # sorted, without repeats
    assert params.bad_words == ("hello",) and params.bad_words_token_ids is None
    assert SamplingParams().allowed_token_ids is None and SamplingParams().bad_words == ()
    admitted = params.with_bad_words_token_ids([[4, 5], [6]])
    wire = msgpack.unpackb(msgpack.packb(admitted.to_wire()))
    assert SamplingParams.from_wire(wire) == admitted
    assert SamplingParams.from_wire(wire).bad_words_token_ids == ((4, 5), (6,))


# ------------------------------------------------------------------------ admission


def fake_encode(text: str) -> list[int]:
    """A tokenizer of one token a character, a space and the letter after it one token of its
    own (as a byte-level BPE's " word"): "ab" -> [97, 98], " ab" -> [1097, 98]."""
    ids, i = [], 0
    while i < len(text):
        if text[i] == " " and i + 1 < len(text):
            ids.append(1000 + ord(text[i + 1]))
            i += 2
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def test_bad_words_are_tokenized_bare_and_with_a_leading_space():
    # both forms, the leading whitespace stripped first
    assert bad_words_token_ids(("ab", "  cd"), fake_encode) == ((97, 98), (1097, 98), (99, 100), (1099, 100))
    # a spaced form of another length, or the same first token, is not a word of its own (vLLM's rule)
    assert bad_words_token_ids(("ab",), lambda t: [1, 2, 3] if t.startswith(" ") else [7, 2]) == ((7, 2),)
    assert bad_words_token_ids(("ab",), lambda t: [7, 3] if t.startswith(" ") else [7, 2]) == ((7, 2),)
    with pytest.raises(ValueError, match="^bad_words: word 0"):
        bad_words_token_ids(("x",), lambda t: [])
    with pytest.raises(ValueError, match=f"^bad_words: .* at most {MAX_BAD_WORDS_TOKENS}"):
        bad_words_token_ids(("w" * 600,), fake_encode)


def test_admission_tokenizes_bad_words_and_checks_ids_against_the_vocabulary():
    params = SamplingParams(max_tokens=4, bad_words=["ab"], allowed_token_ids=[5, 1999])
    admitted = admit(PROMPT, params, LIMITS, encode=fake_encode)
    assert admitted.bad_words_token_ids == ((97, 98), (1097, 98))
    with pytest.raises(ValueError, match="^allowed_token_ids must be token ids in \\[0, 2000\\)"):
        admit(PROMPT, SamplingParams(max_tokens=4, allowed_token_ids=[5, 2000]), LIMITS)
    with pytest.raises(ValueError, match="^bad_words: their tokens must be in \\[0, 2000\\)"):
        admit(PROMPT, SamplingParams(max_tokens=4, bad_words=["\u4e00"]), LIMITS, encode=fake_encode)
    with pytest.raises(ValueError, match="^bad_words need a tokenizer"):
        admit(PROMPT, SamplingParams(max_tokens=4, bad_words=["ab"]), LIMITS)


# ------------------------------------------------------------------------ the sampler


def test_bad_words_ban_the_last_token_only_after_the_others():
    forms = ((5, 6, 7), (9,))
    assert bad_words_ban(forms, []) == (9,)  # a one-token word: always
    assert bad_words_ban(forms, [5]) == (9,)
    assert bad_words_ban(forms, [1, 5, 6]) == (7, 9)
    assert bad_words_ban(forms, [5, 6, 1]) == (9,)
    assert bad_words_ban(forms, [6]) == (9,)
    assert bad_words_ban(((5, 6),), [5, 6, 5]) == (6,)
    params = SamplingParams(min_tokens=2, stop_token_ids=[3]).with_bad_words_token_ids(forms)
    assert step_bans(params, [5, 6], {0}) == (7, 9)
    assert step_bans(params, [5], {0}) == (3, 0, 9)  # min_tokens' bans too


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"allowed_token_ids": [4]},
        {"min_tokens": 2, "stop_token_ids": [3]},
        {"bad_words_token_ids": ((5, 6),)},
    ],
)
def test_a_request_without_its_own_constraints_bans_nothing_and_draws_anything(fields):
    """The engine makes a step's bans and checks a drawn token only for a request whose params
    take tokens out of its rows (Request.has_own_constraints, read once): for every other, bans and
    the check would find nothing, whatever its output so far."""
    from minisgl_core.scheduler.request import Request
    from minisgl_core.token_bans import drawable

    bad_words = fields.pop("bad_words_token_ids", None)
    params = SamplingParams(max_tokens=8, **fields)
    if bad_words is not None:
        params = params.with_bad_words_token_ids(bad_words)
    req = Request(rid=0, prompt_ids=[1, 2], params=params, arrival=0)
    assert req.has_own_constraints == bool(fields or bad_words)
    outputs = [[], [5], [5, 6], [0, 3, 5]]
    finds = [
        bool(step_bans(params, out, {0})) or not all(drawable(params, out, t, {0}) for t in range(9))
        for out in outputs
    ]
    assert any(finds) == req.has_own_constraints


def test_sampler_masks_all_but_the_allowed_ids_and_bans():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    sampler = Sampler(50, torch.device("cpu"))
    allowed = SamplingParams(temperature=0.0, allowed_token_ids=[4, 17, 30])
    free = SamplingParams(temperature=0.0)
    sampled = SamplingParams(temperature=1.5, allowed_token_ids=[4, 17, 30])
    best = int(logits[0, [4, 17, 30]].argmax())
    for _ in range(20):
        out = sampler.sample(
            logits.clone(), [SampleRequest(allowed, []), SampleRequest(free, []), SampleRequest(sampled, [])]
        ).token_ids.tolist()
        assert out[0] == [4, 17, 30][best]
        assert out[1] == int(logits[1].argmax())  # a row without the field: untouched
        assert out[2] in (4, 17, 30)
    # a ban inside the allowed ids: the next best of them
    runner_up = [4, 17, 30][int(logits[0, [4, 17, 30]].argsort(descending=True)[1])]
    banned = SampleRequest(allowed, [], banned=([4, 17, 30][best],))
    assert sampler.sample(logits[:1].clone(), [banned]).token_ids.tolist() == [runner_up]
    # logprobs stay the model's (vLLM's raw logprobs); scaled ones are those of the masked draw
    raw = SamplingParams(temperature=0.0, allowed_token_ids=[4, 17, 30], logprobs=0)
    scaled = SamplingParams(temperature=0.0, allowed_token_ids=[4, 17, 30], logprobs=0, scaled_logprobs=True)
    result = sampler.sample(logits[:2].clone(), [SampleRequest(raw, []), SampleRequest(scaled, [])])
    lp_raw, lp_scaled = result.logprobs(result.token_ids.tolist())
    assert lp_raw.logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[lp_raw.token_id]), abs=1e-5)
    masked = torch.log_softmax(logits[1, [4, 17, 30]], -1)
    assert lp_scaled.logprob == pytest.approx(float(masked.max()), abs=1e-5)


def test_a_request_makes_its_allowed_ids_tensor_once_and_the_sampler_takes_it():
    """Each step built the allowed ids' tensor again from the params' tuple (24,576 ids: 0.35 ms
    of host time a request a step, 7-10% of a CPU run of 16 such requests); the scheduler's
    request now makes it once, and the sampler masks with it as with the ids themselves."""
    from minisgl_core.scheduler.request import Request

    params = SamplingParams(temperature=0.0, allowed_token_ids=[30, 4, 17])
    req = Request(1, [5, 6], params, 0)
    first = req.allowed_ids_on(torch.device("cpu"))
    assert first.tolist() == [4, 17, 30] and req.allowed_ids_on(torch.device("cpu")) is first
    assert Request(2, [5], SamplingParams(), 0).allowed_ids_on(torch.device("cpu")) is None
    # a tensor the sampler is given is the one it masks with: here, one that differs from the params
    logits = torch.randn(1, 50)
    sampler = Sampler(50, torch.device("cpu"))
    given = SampleRequest(params, [], allowed_ids=torch.tensor([9]))
    assert sampler.sample(logits.clone(), [given]).token_ids.tolist() == [9]


# ------------------------------------------------------------------------ the engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM", max_position_embeddings=256
    )


@pytest.fixture(scope="module")
def llm(model_dir):
    with cpu_llm(model_dir) as llm:
        yield llm


def _greedy(llm, prompt: list[int], max_tokens: int = 16, **params):
    return llm.generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **params)
    )[0]


def test_allowed_token_ids_give_transformers_greedy_over_the_masked_logits(llm, model_dir):
    import transformers

    base = _greedy(llm, PROMPT).token_ids
    # the free run's tokens but its first, and some others: the free run is no longer possible
    allowed = sorted({*base[1:], 40, 41, 500, 777})
    out = _greedy(llm, PROMPT, allowed_token_ids=allowed)
    assert set(out.token_ids) <= set(allowed) and out.token_ids != base
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    ids, mask = list(PROMPT), torch.full((model.config.vocab_size,), float("-inf"))
    mask[allowed] = 0.0
    with torch.no_grad():
        for _ in range(16):
            ids.append(int((model(torch.tensor([ids])).logits[0, -1] + mask).argmax()))
    assert out.token_ids == ids[len(PROMPT) :]
    # sampled, with logprobs and truncation: still only those ids
    sampled = llm.generate(
        [PROMPT] * 3,
        SamplingParams(
            temperature=1.5, top_p=0.9, max_tokens=12, ignore_eos=True, logprobs=2, allowed_token_ids=allowed
        ),
    )
    assert all(set(o.token_ids) <= set(allowed) for o in sampled)


def _word_forms(llm, ids: list[int]) -> list[tuple[int, str, tuple[int, ...]]]:
    """(position, text, form) of each pair of consecutive output tokens whose text tokenizes back
    to the pair as bad_words reads it."""
    tok = llm.tokenizer
    found = []
    for i in range(1, len(ids) - 1):
        text = tok.decode(ids[i : i + 2])
        forms = (
            bad_words_token_ids((text,), lambda t: tok.encode(t, add_special_tokens=False))
            if text.strip()
            else ()
        )
        if tuple(ids[i : i + 2]) in forms:
            found.append((i, text, tuple(ids[i : i + 2])))
    return found


def _contains(ids: list[int], part: tuple[int, ...]) -> bool:
    return any(tuple(ids[i : i + len(part)]) == part for i in range(len(ids) - len(part) + 1))


def test_bad_words_change_the_output_only_where_the_word_would_end(llm, model_dir):
    prompts = [PROMPT, [7, 8, 9, 10], [300, 301, 302, 303, 304]]
    bases = [_greedy(llm, p, 24).token_ids for p in prompts]
    cases = [(p, base, hit) for p, base in zip(prompts, bases) for hit in _word_forms(llm, base)[:1]]
    if not cases:
        pytest.skip("no two output tokens that are a word of the tokenizer")
    for prompt, base, (at, text, form) in cases:
        out = _greedy(llm, prompt, 24, bad_words=[text]).token_ids
        assert out[: at + 1] == base[: at + 1], text  # the word's first token: still there
        assert out[at + 1] != base[at + 1] and not _contains(out, form), (text, out)
    # a one-token word: never sampled, and the output is the same until its first place
    singles = [
        (prompt, base, token, word)
        for prompt, base in zip(prompts, bases)
        for token in base
        if (word := llm.tokenizer.decode([token])).strip()
        and (token,)
        in bad_words_token_ids((word,), lambda t: llm.tokenizer.encode(t, add_special_tokens=False))
    ]
    assert singles, "no output token is a one-token word"
    for prompt, base, token, word in singles[:3]:
        out = _greedy(llm, prompt, 24, bad_words=[word]).token_ids
        first = base.index(token)
        assert out[:first] == base[:first] and token not in out, (word, out)
    # the same under overlap scheduling and without it (bans read the newest token on the host)
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words=[c[2][1]]) for c in cases
    ]
    with cpu_llm(model_dir, overlap=False) as serial:
        want = [o.token_ids for o in serial.generate([c[0] for c in cases], params)]
    assert [o.token_ids for o in llm.generate([c[0] for c in cases], params)] == want


def test_engine_refuses_bad_words_not_admitted(llm):
    params = SamplingParams(max_tokens=4, bad_words=["hello"])
    with pytest.raises(ValueError, match="admit the request first"):
        llm.engine.add_request(10**6, PROMPT, params)
    with pytest.raises(ValueError, match="^allowed_token_ids must be token ids"):
        llm.generate([PROMPT], SamplingParams(max_tokens=4, allowed_token_ids=[llm.engine.runner.vocab_size]))


def test_constraints_that_leave_no_token_end_the_request_as_invalid(llm):
    """allowed_token_ids, the bans (min_tokens', bad_words') and a grammar can together leave a
    row without a finite logit; the sampler then drew an arbitrary token (often 0), which was
    output: a token outside allowed_token_ids, a stop token before min_tokens, a bad word's token
    (a 200 with the wrong text), or a 500 where the grammar rejected it. The request now ends as
    "invalid" (a 400 on the server) saying why, without that token; the others in the batch run
    on. Greedy and sampled rows alike, at the first token and later."""
    from minisgl_core.api import GrammarSpec

    eos = sorted(llm.engine.scheduler.stop_checker.eos_ids)
    a, b = 40, 41
    # (after a, both forms ban what is left: a dead row at the second token)
    dynamic = dict(allowed_token_ids=[a, b], bad_words_token_ids=[[a, a], [a, b]], logit_bias={a: 100})
    cases = [
        (SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=eos, min_tokens=3), [], "allowed_token_ids and min_tokens"),
        (SamplingParams(temperature=1.0, top_k=5, max_tokens=6, allowed_token_ids=eos, min_tokens=3), [], "allowed_token_ids and min_tokens"),
        (SamplingParams(temperature=0.0, max_tokens=6, bad_words_token_ids=[[a]], allowed_token_ids=[a]), [], "allowed_token_ids and bad_words"),
        (SamplingParams(temperature=0.0, max_tokens=6, **dynamic), [a], "allowed_token_ids and bad_words"),
        (SamplingParams(temperature=1.0, top_p=0.9, max_tokens=6, **dynamic), [a], "allowed_token_ids and bad_words"),
        (SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=[a], grammar=GrammarSpec("regex", "x+")), [], "allowed_token_ids and the grammar"),
        (SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=[0, a], grammar=GrammarSpec("regex", "x+")), [], "allowed_token_ids and the grammar"),
        # only what banned a token at that step is named: not a min_tokens already reached, nor a
        # bad word the output is not in the middle of
        (SamplingParams(temperature=0.0, max_tokens=6, min_tokens=1, **dynamic), [a], "allowed_token_ids and bad_words"),
        (SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=eos, min_tokens=3, bad_words_token_ids=[[a, b]]), [], "allowed_token_ids and min_tokens"),
        (SamplingParams(temperature=0.0, max_tokens=6, allowed_token_ids=[a], bad_words_token_ids=[[b, b]], grammar=GrammarSpec("regex", "x+")), [], "allowed_token_ids and the grammar"),
    ]  # fmt: skip
    free = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    # (admission refuses the first three, dead at the first token: test_admission_refuses_...;
    # the engine, which trusts what it is given, still must not output an arbitrary token)
    engine, outs = llm.engine, {}
    for rid, params in enumerate([c[0] for c in cases] + [free]):
        engine.add_request(rid, PROMPT, params)
    while engine.has_work:
        for o in engine.step():
            tokens, _, _ = outs.setdefault(o.rid, ([], None, None))
            if o.token_id >= 0:
                tokens.append(o.token_id)
            if o.finished:
                outs[o.rid] = (tokens, o.finish_reason, o.error)
    for rid, (_, tokens, fields) in enumerate(cases):
        got, reason, error = outs[rid]
        assert reason == "invalid", (fields, reason, got)
        assert got == tokens, fields
        assert error.startswith(
            f"no token is left to sample after {len(tokens)} output token(s): {fields} rule out"
        )
    assert outs[len(cases)][:2] == (_greedy(llm, PROMPT, 6).token_ids, "length")


@pytest.mark.parametrize(
    ("fields", "dead", "fine"),
    [
        # every allowed token a stop token before min_tokens (eos is 2 in these limits)
        ("allowed_token_ids and min_tokens", dict(allowed_token_ids=[2], min_tokens=1), dict(allowed_token_ids=[2])),
        ("allowed_token_ids and min_tokens", dict(allowed_token_ids=[2, 7], stop_token_ids=[7], min_tokens=3),
         dict(allowed_token_ids=[2, 7, 8], stop_token_ids=[7], min_tokens=3)),
        # every allowed token a one-token bad word
        ("allowed_token_ids and bad_words", dict(allowed_token_ids=[5, 6], bad_words_token_ids=[[5], [6]]),
         dict(allowed_token_ids=[5, 6], bad_words_token_ids=[[5], [9, 6]])),
        ("allowed_token_ids, min_tokens and bad_words",
         dict(allowed_token_ids=[2, 5], bad_words_token_ids=[[5]], min_tokens=1),
         dict(allowed_token_ids=[2, 5], bad_words_token_ids=[[5]], ignore_eos=True, min_tokens=1)),
    ],
)  # fmt: skip
def test_admission_refuses_constraints_that_leave_the_first_token_nothing(fields, dead, fine):
    """Found at the first step, such a request ended as "invalid": on the server a stream that had
    started (a 200 whose only event is an error). Admission now refuses it, as it refuses a
    min_tokens above max_tokens; what leaves a token there (a bad word of two tokens, ignore_eos
    lifting min_tokens' ban on eos) is admitted."""
    limits = Limits(256, 256, 2000, [2])
    with pytest.raises(ValueError) as raised:
        admit(PROMPT, SamplingParams(max_tokens=4, **dead), limits)
    assert str(raised.value).startswith(
        f"no token is left to sample after 0 output token(s): {fields} rule out every token"
    ), raised.value
    admit(PROMPT, SamplingParams(max_tokens=4, **fine), limits)


def test_no_token_left_names_only_what_banned_a_token_at_that_step():
    """It named every constraint the request had: min_tokens long after its count, a bad word the
    output was nowhere near. A field is named where it took tokens out of that step's row."""
    eos = [2]
    params = SamplingParams(allowed_token_ids=[5, 6], min_tokens=2, bad_words_token_ids=[[5, 6], [8, 5]])
    # min_tokens passed, the output ending with 5 (bad word [5, 6] bans 6)
    passed = no_token_left(params, [7, 5], eos)
    assert passed.startswith(
        "no token is left to sample after 2 output token(s): allowed_token_ids and bad_words rule out"
    ), passed
    assert "min_tokens" not in passed
    # before min_tokens' count, no bad word in progress (7 begins none)
    early = no_token_left(params, [7], eos)
    assert early.startswith(
        "no token is left to sample after 1 output token(s): allowed_token_ids and min_tokens rule out"
    )
    assert "bad_words" not in early
    # both at work: before the count and right after a bad word's first token
    both = no_token_left(params, [5], eos)
    assert both.startswith(
        "no token is left to sample after 1 output token(s): allowed_token_ids, min_tokens and bad_words rule out"
    )
    # min_tokens bans nothing under ignore_eos without stop_token_ids: not named
    lifted = SamplingParams(allowed_token_ids=[5], min_tokens=2, ignore_eos=True)
    assert "min_tokens" not in no_token_left(lifted, [], eos)
    # a grammar alone: still a sentence, the grammar's note kept
    from minisgl_core.api import GrammarSpec

    grammar = SamplingParams(bad_words_token_ids=[[5, 6]], grammar=GrammarSpec("regex", "x+"))
    alone = no_token_left(grammar, [7], eos)
    assert alone.startswith(
        "no token is left to sample after 1 output token(s): the grammar rules out every token"
    )
    assert "bad_words" not in alone and "response_format" in alone


def test_the_field_a_refusal_names_is_the_requests_own_constraint_before_its_grammar():
    """The 400 of a request whose constraints left no token had param null. It names the first
    of its own constraints at work at that step (widening it keeps the output's format: admission
    checked the grammar alone accepts a text); the grammar (the field that set it) only alone."""
    from minisgl_core.api import GrammarSpec

    eos, grammar = [2], GrammarSpec("json_schema", '{"type": "object"}')
    params = SamplingParams(allowed_token_ids=[5, 6], bad_words_token_ids=[[5, 6]], grammar=grammar)
    assert no_token_left_field(params, [], eos) == "allowed_token_ids"
    assert no_token_left_field(params, [5], eos) == "allowed_token_ids"
    banned = SamplingParams(bad_words_token_ids=[[5, 6]], grammar=grammar)
    assert no_token_left_field(banned, [7, 5], eos) == "bad_words"
    assert no_token_left_field(banned, [7], eos) == "grammar"  # (the bad word bans nothing there)
    plain = SamplingParams(min_tokens=2, bad_words_token_ids=[[5, 6]])
    assert no_token_left_field(plain, [7], eos) == "min_tokens"
    assert no_token_left_field(plain, [7, 7, 5], eos) == "bad_words"


def test_offline_generate_refuses_a_dead_first_token_before_anything_runs(llm):
    eos = sorted(llm.engine.scheduler.stop_checker.eos_ids)
    params = [SamplingParams(max_tokens=4), SamplingParams(max_tokens=4, allowed_token_ids=eos, min_tokens=2)]
    with pytest.raises(ValueError, match=r"^prompts\[1\]: no token is left to sample after 0"):
        llm.generate([PROMPT, PROMPT], params)
    assert not llm.engine.has_work


def test_token_id_bans_given_directly_hold_under_overlap(llm, model_dir):
    """``bad_words_token_ids`` given as they are (``bad_words`` empty) ran under overlap
    scheduling, whose bans read the output without the token in flight: a banned pair was
    sampled (and, with the drawn-token check, the request then ended as "invalid"). Such a request
    now reads its newest token on the host, as one with ``bad_words`` does: the pair never
    appears and the output is the overlap-off run's."""
    prompts = [PROMPT, [7, 8, 9, 10], [300, 301, 302, 303, 304]]
    bases = [_greedy(llm, p, 24).token_ids for p in prompts]
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, bad_words_token_ids=[base[5:7]])
        for base in bases
    ]
    outs = llm.generate(prompts, params)
    with cpu_llm(model_dir, overlap=False) as serial:
        want = [o.token_ids for o in serial.generate(prompts, params)]
    for out, base, expected in zip(outs, bases, want):
        assert out.finish_reason == "length", out.error
        assert not _contains(out.token_ids, tuple(base[5:7])) and out.token_ids == expected

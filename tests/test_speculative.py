"""Speculative decoding (n-gram drafts, one verify forward): the output is the one without it.

The tiny random model's greedy output falls into loops quickly, which prompt lookup then drafts:
so verify steps with accepted and rejected drafts both happen here. The real default model
copies text when asked to, which is where drafts pay off."""

from __future__ import annotations

import json
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl_core import LLM, SamplingParams
from minisgl_core.api import GrammarSpec
from minisgl_core.config import EngineConfig
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.runner.quantization import quantizable_layers
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.speculative import Drafter, NgramDrafter, Speculator
from minisgl_core.testing import assert_kv_released, cpu_llm, drain

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
SPEC = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4)

# ------------------------------------------------------------------ the n-gram drafter


def brute_force_lookup(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The longest suffix (max_n..min_n) occurring earlier; the tokens after its latest occurrence."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if length <= n:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):  # latest earlier occurrence first
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


def request(prompt: list[int], output: list[int] | None = None, **params) -> Request:
    return Request(
        rid=0, prompt_ids=list(prompt), params=SamplingParams(**params), arrival=0, output_ids=output or []
    )


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    split=st.integers(1, 60),
    k=st.integers(1, 6),
    sizes=st.sampled_from([(4, 1), (3, 2), (2, 2), (1, 1)]),
)
def test_ngram_lookup_matches_brute_force_as_the_output_grows(tokens, split, k, sizes):
    max_n, min_n = sizes
    prompt, output = tokens[: min(split, len(tokens))], tokens[min(split, len(tokens)) :]
    drafter = NgramDrafter(max_n, min_n)
    req = request(prompt)
    # the index is extended incrementally: ask after every appended token
    for token in [None, *output]:
        if token is not None:
            req.output_ids.append(token)
        [draft] = drafter.propose([req], [k])
        assert draft == brute_force_lookup(req.all_ids(), k, max_n, min_n)


def test_ngram_drafter_proposes_the_continuation_of_the_latest_match():
    drafter = NgramDrafter(3, 1)
    req = request([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2], [3])
    # suffix [1, 2, 3] last occurred ending at index 9: it was followed by 7, 8, 1, 2
    assert drafter.propose([req], [3]) == [[7, 8, 1]]
    assert drafter.propose([req], [0]) == [[]]
    assert drafter.propose([request([5, 6, 7])], [4]) == [[]]  # nothing repeats


def test_config_refuses_bad_speculative_settings():
    with pytest.raises(ValueError, match="speculative_algorithm"):
        EngineConfig(model="x", speculative_algorithm="eagle")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        EngineConfig(model="x", speculative_algorithm="ngram", speculative_num_draft_tokens=0)
    with pytest.raises(ValueError, match="n-gram sizes"):
        EngineConfig(model="x", speculative_ngram_min=3, speculative_ngram_max=2)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        Speculator(NgramDrafter(), 0)


# ------------------------------------------------------------------ the engine, tiny model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM", max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(1)
    out = []
    for i in range(12):
        piece = [rng.randrange(5, 1000) for _ in range(rng.randrange(3, 12))]
        # copy-heavy ones (a piece repeated) and plain random ones, mixed in one batch
        out.append(piece * 4 if i % 2 == 0 else [rng.randrange(5, 1000) for _ in range(rng.randrange(2, 40))])
    return out


@pytest.fixture(scope="module")
def plain(model_dir):
    llm = cpu_llm(model_dir, cache="naive")
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def reference(plain, prompts):
    return [plain.generate([p], GREEDY)[0].token_ids for p in prompts]


@pytest.mark.parametrize(
    "options",
    [
        dict(cache="naive"),
        dict(cache="radix"),
        dict(cache="radix", page_size=16),
        dict(cache="naive", page_size=4, speculative_num_draft_tokens=7),
        dict(cache="radix", speculative_num_draft_tokens=1, speculative_ngram_max=2),
        # a pool so small that requests queue and decode retracts
        dict(cache="radix", num_kv_tokens=160, max_running_requests=4),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_greedy_output_is_unchanged_and_drafts_are_accepted(model_dir, prompts, reference, options):
    llm = cpu_llm(model_dir, **(SPEC | options))
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" for o in outs)
    stats = llm.engine.stats()
    assert stats["spec_verify_steps"] > 0
    assert stats["spec_accepted_tokens"] > 0
    # some drafts were also rejected: both paths of the rollback ran
    assert stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    assert stats["spec_emitted_tokens"] > stats["spec_request_steps"]
    assert_kv_released(llm)
    if options["cache"] == "radix":
        llm.engine.scheduler.kv.cache.check_integrity()
    llm.close()


@pytest.mark.parametrize(
    "options",
    [
        dict(kv_cache_dtype="fp8_e4m3"),
        dict(quantization="int8"),
        dict(quantization="int4"),
        dict(quantization="int8", kv_cache_dtype="fp8_e4m3"),
        dict(quantization="fp8", kv_cache_dtype="fp8_e4m3"),
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_speculation_with_quantized_weights_and_fp8_kv(model_dir, prompts, options):
    """Verify steps read and write the same pool and run the same linear layers as decode steps:
    under the same quantization flags, greedy output with drafts is the one without."""
    subset = prompts[:6]
    runs = []
    for spec in ({}, SPEC):
        llm = cpu_llm(model_dir, cache="radix", **(options | spec))
        if "kv_cache_dtype" in options:
            assert llm.engine.runner.kv_cache.buffer.dtype == torch.float8_e4m3fn
        if "quantization" in options:
            layers = quantizable_layers(llm.engine.runner.model)
            assert {m.quant_method.name for m in layers} == {options["quantization"]}
        runs.append([o.token_ids for o in llm.generate(subset, GREEDY)])
        stats = llm.engine.stats()
        assert_kv_released(llm)
        llm.close()
    plain, spec = runs
    assert spec == plain
    assert stats["spec_accepted_tokens"] > 0


@pytest.fixture(scope="module")
def spec_llm(model_dir):
    llm = cpu_llm(model_dir, cache="radix", **SPEC)
    yield llm
    llm.close()


def test_stops_inside_an_accepted_run_end_at_the_right_token(spec_llm, plain, prompts, reference):
    # every max_tokens ends somewhere in a run of accepted drafts for some prompt
    for max_tokens in (1, 2, 3, 5, 8, 13):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        outs = spec_llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [r[:max_tokens] for r in reference]
    # a stop token id: the output ends at its first occurrence (kept, as the plain engine does)
    for ref, prompt in zip(reference, prompts):
        stop_token = ref[len(ref) // 2]
        params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_token])
        got, want = spec_llm.generate([prompt], params)[0], plain.generate([prompt], params)[0]
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason == "stop"
        assert (got.matched_stop, got.text) == (want.matched_stop, want.text)
    assert_kv_released(spec_llm)


def test_stop_strings_end_at_the_right_token(spec_llm, plain, prompts, reference):
    tok = plain.tokenizer
    for ref, prompt in list(zip(reference, prompts))[::3]:
        text = tok.decode(ref[:30])
        stop = text[len(text) // 2 : len(text) // 2 + 3].strip() or text[-2:]
        params = SamplingParams(temperature=0.0, max_tokens=40, stop=[stop])
        got, want = spec_llm.generate([prompt], params)[0], plain.generate([prompt], params)[0]
        assert (got.token_ids, got.text, got.finish_reason) == (want.token_ids, want.text, want.finish_reason)
    assert_kv_released(spec_llm)


def test_min_tokens_bans_stop_tokens_at_each_verified_position(spec_llm, plain, prompts, reference):
    """A verify batch's rows each ban the stop tokens by their own position: with drafts, the
    output is the plain engine's, stop token ids and stop strings before min_tokens ignored."""
    tok = plain.tokenizer
    for ref, prompt in list(zip(reference, prompts))[::2]:
        stop_token = ref[2]
        text = tok.decode(ref[:6])
        for min_tokens in (4, 9):
            params = SamplingParams(
                temperature=0.0,
                max_tokens=30,
                stop_token_ids=[stop_token],
                stop=[text[-2:]],
                min_tokens=min_tokens,
            )
            got, want = spec_llm.generate([prompt], params)[0], plain.generate([prompt], params)[0]
            assert (got.token_ids, got.text, got.finish_reason) == (
                want.token_ids,
                want.text,
                want.finish_reason,
            )
            assert len(got.token_ids) >= min_tokens and stop_token not in got.token_ids[:min_tokens]
    assert_kv_released(spec_llm)


def test_penalties_bias_and_logprobs_follow_each_position(spec_llm, plain, prompts):
    # each verified position sees the output as if the drafts before it were accepted
    params = SamplingParams(
        temperature=0.0,
        max_tokens=30,
        ignore_eos=True,
        frequency_penalty=0.3,
        presence_penalty=0.2,
        repetition_penalty=1.1,
        logit_bias={7: 1.5},
        logprobs=2,
    )
    got, want = spec_llm.generate(prompts, params), plain.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for g, w in zip(got, want):
        assert [lp.token_id for lp in g.logprobs] == g.token_ids
        for a, b in zip(g.logprobs, w.logprobs):
            assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_constrained_requests_share_verify_batches(spec_llm, plain, prompts):
    schema = GrammarSpec(
        "json_schema", json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    )
    constrained = SamplingParams(temperature=0.0, max_tokens=30, grammar=schema)
    params = [constrained if i % 3 == 0 else GREEDY for i in range(len(prompts))]
    before = spec_llm.engine.stats()["spec_verify_steps"]
    got, want = spec_llm.generate(prompts, params), plain.generate(prompts, params)
    assert spec_llm.engine.stats()["spec_verify_steps"] > before
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for o, p in zip(got, params):
        if p is constrained and o.finish_reason == "stop":
            json.loads(o.text)


def test_step_trace_times_the_phases_of_verify_steps(model_dir, prompts, reference, tmp_path):
    """A verify step's trace line splits its host time by phase as a plain step's does (forward,
    sample, sync, process): it held only ``schedule``, so a trace of a speculative run showed no
    forward time for most of its steps."""
    path = tmp_path / "steps.jsonl"
    llm = cpu_llm(model_dir, cache="naive", step_trace=str(path), **SPEC)
    outs = llm.generate(prompts, GREEDY)
    llm.close()
    assert [o.token_ids for o in outs] == reference
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    verify = [s for s in steps if s.get("kind") == "verify"]
    decode = [s for s in steps if s.get("kind") == "decode"]
    assert verify and decode
    for s in verify + decode:
        assert {"schedule", "forward", "sample", "sync", "process"} <= set(s["ms"]), s
        assert all(v >= 0 for v in s["ms"].values()), s


class _Oracle(Drafter):
    """Proposes each request's reference continuation (so every draft is right), and records what
    it proposed while a request reasoned before its grammar."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = references
        self.while_reasoning: list[list[int]] = []

    def propose(self, requests, max_drafts):
        out = []
        for req, k in zip(requests, max_drafts):
            done = len(req.output_ids)
            draft = self.references[tuple(req.prompt_ids)][done : done + k] if k > 0 else []
            if draft and req.reasoning is not None:
                self.while_reasoning.append(draft)
            out.append(draft)
        return out


def test_drafts_run_while_a_request_reasons_before_its_grammar(tmp_path_factory, prompts):
    """A request constrained after its reasoning (reasoning_tag_ids) takes drafts while it
    reasons, cut short of the end tag (the row after it would need the grammar's mask), and the
    output is the one without speculation: through the n-gram drafter, and through a drafter
    proposing the right continuation, end tag and answer included."""
    model = make_model_dir(
        tmp_path_factory.mktemp("t") / "thinker", "LlamaForCausalLM", max_position_embeddings=512,
        added_tokens=("<think>", "</think>"),
    )  # fmt: skip
    plain = cpu_llm(model, cache="naive")
    start, end = plain.tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    word = GrammarSpec("regex", "[a-z]{3,6}")
    params = SamplingParams(
        temperature=0.0, max_tokens=40, grammar=word, logit_bias={start: 5.0, end: 4.0},
        reasoning_tag_ids=(start, end),
    )  # fmt: skip
    want = [o.token_ids for o in plain.generate(prompts, params)]
    plain.close()
    # (the biases make some reason a few tokens, then answer; others reason to max_tokens)
    assert any(ids[0] == start and end in ids[2:] for ids in want), want
    oracle = _Oracle({tuple(p): ids for p, ids in zip(prompts, want)})
    for drafter in ("ngram", oracle):
        spec = cpu_llm(model, cache="naive", **SPEC)
        if drafter is oracle:
            spec.engine.verify.speculator.drafter = oracle
        got = [o.token_ids for o in spec.generate(prompts, params)]
        stats = spec.engine.stats()
        spec.close()
        assert got == want, drafter
        assert stats["spec_accepted_tokens"] > 0, (drafter, stats)
    assert oracle.while_reasoning and any(end in d for d in oracle.while_reasoning)


def test_abort_mid_run_frees_everything(spec_llm, prompts):
    engine = spec_llm.engine
    for rid, prompt in enumerate(prompts, start=10_000):
        engine.add_request(rid, prompt, GREEDY)
    steps = 0
    while engine.stats()["spec_verify_steps"] == 0 or steps < 6:
        engine.step()
        steps += 1
    for rid in range(10_000, 10_000 + len(prompts), 2):
        engine.abort(rid)
    drain(engine)
    assert_kv_released(spec_llm)
    spec_llm.engine.scheduler.kv.cache.check_integrity()


def test_emitted_tokens_count_what_the_requests_got(model_dir, prompts, reference):
    """``spec_emitted_tokens`` counts the tokens verify steps gave requests: a stop token inside a
    run of accepted drafts ends the request there, and the tokens of the run after it (dropped)
    were counted too, so the acceptance length ``bench offline`` reports was overstated."""
    llm = cpu_llm(model_dir, cache="naive", **SPEC)
    llm.engine.verify.speculator.drafter = _Oracle({tuple(p): ref for p, ref in zip(prompts, reference)})
    ref = reference[0]
    # a token first seen inside the first verify step's run of (all accepted) drafts
    end = next(i for i in range(2, 5) if ref[i] not in ref[:i])
    params = SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[ref[end]])
    out = llm.generate([prompts[0]], params)[0]
    stats = llm.engine.stats()
    llm.close()
    assert out.token_ids == ref[: end + 1]
    # the first token is the prefill's, every other one a verify step's
    assert stats["spec_emitted_tokens"] == len(out.token_ids) - 1, stats
    assert stats["spec_request_steps"] == 1, stats


class ConstantDrafter(Drafter):
    """Always guesses the same tokens: verify steps at every decode step, accepted or not by chance."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens

    def propose(self, requests, max_drafts):
        return [self.tokens[:k] for k in max_drafts]


def test_sampling_keeps_the_target_distribution(model_dir):
    """temperature > 0: outputs drawn through verify steps have the distribution they have without
    speculation (two-sample chi-square over the first two tokens, top-k 3 so the cells are few)."""
    prompt = [11, 12, 13, 14, 15]
    params = SamplingParams(temperature=2.0, max_tokens=3, ignore_eos=True, top_k=3)
    n = 400
    plain = cpu_llm(model_dir, cache="naive")
    samples = [tuple(o.token_ids[1:]) for o in plain.generate([prompt] * n, params)]
    plain.close()
    # guess the most frequent second token, and a third: accepted often, rejected often
    second = max(set(s[0] for s in samples), key=[s[0] for s in samples].count)
    spec = cpu_llm(model_dir, cache="naive", **SPEC)
    spec.engine.verify.speculator.drafter = ConstantDrafter([second, second])
    spec_samples = [tuple(o.token_ids[1:]) for o in spec.generate([prompt] * n, params)]
    stats = spec.engine.stats()
    spec.close()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
    keys = sorted(set(samples) | set(spec_samples))
    table = [[c.count(k) for k in keys] for c in (samples, spec_samples)]
    # pool the rare outcomes so every expected count is large enough for the test
    common = [j for j in range(len(keys)) if table[0][j] + table[1][j] >= 10]
    rare = [j for j in range(len(keys)) if j not in common]
    rows = [[row[j] for j in common] + [sum(row[j] for j in rare)] for row in table]
    rows = [list(col) for col in zip(*rows) if sum(col) > 0]
    assert len(rows) > 3, "the test needs an output distribution with several outcomes"
    p_value = chi_square_p_value(list(zip(*rows)))
    assert p_value > 1e-3, (p_value, keys, table)


def test_seeded_sampling_draws_what_decoding_without_drafts_draws(model_dir, prompts):
    """A seeded request's text is the one without speculation, whatever shares its steps: each
    verified position draws the noise plain decoding draws at that position, and the draws of
    positions rejected are taken back. Before, a request drew at every verified position, so its
    text depended on how many drafts each step carried: a prompt arriving mid-run (its prefill
    steps carry the running decodes one token each) changed it."""
    seeded = [
        SamplingParams(temperature=0.5, max_tokens=40, ignore_eos=True, seed=1234),
        SamplingParams(temperature=0.5, top_k=40, max_tokens=40, ignore_eos=True, seed=-7),
    ]
    late_prompt = prompts[1] * 3

    def run(llm: LLM, params: SamplingParams, late: int | None) -> list[int]:
        # the seeded request alone, or with another prompt arriving at step ``late``
        engine, tokens = llm.engine, []
        engine.add_request(1, prompts[0], params)
        step = 0
        while engine.has_work:
            if step == late:
                engine.add_request(2, late_prompt, GREEDY)
            tokens += [o.token_id for o in engine.step() if o.rid == 1]
            step += 1
        return tokens

    plain = cpu_llm(model_dir, cache="naive", max_prefill_tokens=16)
    want = [run(plain, p, None) for p in seeded]
    plain.close()
    spec = cpu_llm(model_dir, cache="naive", max_prefill_tokens=16, **SPEC)
    for params, tokens in zip(seeded, want):
        for late in (None, 3, 9):
            assert run(spec, params, late) == tokens, (params, late)
    stats = spec.engine.stats()
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"], stats
    assert_kv_released(spec)
    spec.close()


def chi_square_p_value(table: list[tuple[int, ...]]) -> float:
    """Pearson's test of independence on a 2 x m contingency table."""
    totals = [sum(row) for row in table]
    columns = [sum(col) for col in zip(*table)]
    n = sum(totals)
    stat = sum(
        (table[i][j] - totals[i] * columns[j] / n) ** 2 / (totals[i] * columns[j] / n)
        for i in range(len(table))
        for j in range(len(columns))
    )
    dof = (len(table) - 1) * (len(columns) - 1)
    # upper regularised incomplete gamma: the chi-square survival function
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


# ------------------------------------------------------------------ the real default model


COPY_TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
    "single step. All that glitters is not gold, and not all those who wander are lost."
)


def test_real_model_copies_with_drafts_and_the_same_tokens(default_model_dir):
    from minisgl_core.tokenizer.load import apply_chat_template

    messages = [
        [{"role": "user", "content": f"Repeat this text exactly: {COPY_TEXT}"}],
        [{"role": "user", "content": "What is the capital of France?"}],  # little to look up
    ]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    outputs = []
    for options in ({}, SPEC):
        llm = LLM(default_model_dir, device="cpu", attn="torch", num_kv_tokens=2048, **options)
        prompts = [apply_chat_template(llm.tokenizer, m) for m in messages]
        outputs.append(llm.generate(prompts, params))
        stats = llm.engine.stats()
        llm.close()
    plain, spec = outputs
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert "quick brown fox" in spec[0].text  # it did copy: that is what the drafts predict
    accept_len = stats["spec_emitted_tokens"] / stats["spec_request_steps"]
    assert accept_len > 1.5, stats


def test_bench_offline_reports_overlap_off_under_speculation(tmp_path):
    """``bench offline --speculative-algorithm ngram`` reported ``"overlap": true``, the flag's
    default, while speculation runs without it: the JSON says what the engine ran with."""
    from minisgl_core.testing.cli_runner import run_cli

    model_dir = make_model_dir(tmp_path / "m", "LlamaForCausalLM", vocab_size=10_240)
    runs = {}
    for name, extra in (("spec", ["--speculative-algorithm", "ngram"]), ("plain", [])):
        proc = run_cli(
            ["bench", "offline", "--model", str(model_dir), "--num-requests", "1", "--attn", "torch", *extra],
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert runs["spec"]["overlap"] is False and "speculative" in runs["spec"]
    assert runs["plain"]["overlap"] is True and "speculative" not in runs["plain"]


def test_allowed_token_ids_and_bad_words_keep_verification_lossless(spec_llm, plain, prompts, reference):
    """Every verified position gets the allowed ids' mask and its own bad-word bans (the output
    before it taken as if the drafts before it were accepted): greedy output is the plain
    engine's, with drafts accepted along the way."""
    tok = plain.tokenizer
    accepted = spec_llm.engine.stats()["spec_accepted_tokens"]
    changed = 0
    for ref, prompt in list(zip(reference, prompts))[::2]:
        words = [w for w in (tok.decode(ref[3:5]), tok.decode(ref[8:10]), tok.decode(ref[6:7])) if w.strip()]
        for params in (
            SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, bad_words=words),
            SamplingParams(
                temperature=0.0, max_tokens=30, ignore_eos=True, allowed_token_ids=sorted(set(ref) - {ref[9]})
            ),
        ):
            got, want = spec_llm.generate([prompt], params)[0], plain.generate([prompt], params)[0]
            assert got.token_ids == want.token_ids, params
            changed += got.token_ids != ref[:30]
    assert changed > 0
    assert spec_llm.engine.stats()["spec_accepted_tokens"] > accepted
    assert_kv_released(spec_llm)

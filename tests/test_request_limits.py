"""Requests at the edges: integer ranges, tiny temperatures, penalties with early stops under
overlap scheduling, and an offline LLM that frees its memory when closed."""

from __future__ import annotations

import gc
import os
import re
import signal
import weakref
from collections.abc import Mapping
from fractions import Fraction

import msgpack
import pytest
import torch

from minisgl_core import LLM, SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.runner.sampler import Sampler, SampleRequest
from minisgl_core.sampling import INT64_MAX, INT64_MIN, MIN_TEMPERATURE, choice_seed
from minisgl_core.testing import cpu_llm

PROMPTS = [[11, 12, 13], [200, 300, 400, 500], [7] * 9, [42, 43]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256
    )


@pytest.fixture(scope="module")
def llm(model_dir):
    with cpu_llm(model_dir) as llm:
        yield llm


# ------------------------------------------------------------------------ integer ranges


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_k", 2**63),
        ("top_k", 2**64 - 1),
        ("seed", 2**64 - 1),
        ("seed", INT64_MIN - 1),
        ("max_tokens", 2**64),
        ("max_tokens", -(2**63)),
        ("logprobs", 2**64),
        ("stop_token_ids", [5, 2**64]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [True]),
    ],
)
def test_integers_out_of_range_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be an integer in"):
        SamplingParams(**{field: value})


def test_choice_seeds_stay_64_bit_and_distinct():
    assert choice_seed(5, 1) == 6
    assert choice_seed(INT64_MAX, 1) == INT64_MIN
    seeds = [choice_seed(INT64_MAX - 2, i) for i in range(8)]
    assert len(set(seeds)) == 8 and all(INT64_MIN <= s <= INT64_MAX for s in seeds)


def test_extreme_integers_in_range_run_offline(llm):
    greedy = llm.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    # top_k past the vocabulary keeps every token: the same draws as top_k disabled, seeded alike
    for seed in (INT64_MAX, INT64_MIN):
        unlimited = SamplingParams(top_k=INT64_MAX, seed=seed, max_tokens=4, ignore_eos=True)
        disabled = SamplingParams(top_k=-1, seed=seed, max_tokens=4, ignore_eos=True)
        a, b = llm.generate(PROMPTS[:1], unlimited)[0], llm.generate(PROMPTS[:1], disabled)[0]
        assert a.token_ids == b.token_ids and len(a.token_ids) == 4
    big_k_greedy = SamplingParams(temperature=0, top_k=INT64_MAX, max_tokens=4, ignore_eos=True)
    assert llm.generate(PROMPTS[:1], big_k_greedy)[0].token_ids == greedy.token_ids


@pytest.mark.parametrize(
    "field", ["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"]
)
def test_float_fields_given_integers_past_a_float_are_refused_naming_the_field(field):
    """10**400 (past a float's range) was an OverflowError from math.isfinite, not a ValueError."""
    for value in (10**400, -(10**400)):
        with pytest.raises(ValueError, match=f"^{field} must be a finite number, got "):
            SamplingParams(**{field: value})


def test_float_fields_given_large_integers_run_as_floats(llm):
    """repetition_penalty=10**20 (an int beyond torch's 64 bits) passed the checks, then the
    sampler's ``scores * penalty`` raised an OverflowError inside generate; every float field is
    now kept as a Python float (as numpy's already were), with the same draws as the float."""
    params = SamplingParams(repetition_penalty=10**20, temperature=10**20, max_tokens=3, seed=1)
    assert (type(params.repetition_penalty), type(params.temperature), type(SamplingParams(top_p=1).top_p)) == (
        float, float, float,
    )  # fmt: skip
    given = llm.generate(PROMPTS[:1], params)[0]
    as_float = SamplingParams(repetition_penalty=1e20, temperature=1e20, max_tokens=3, seed=1)
    assert given.token_ids == llm.generate(PROMPTS[:1], as_float)[0].token_ids
    with pytest.raises(ValueError, match=r"^temperature must be >= 0, got -1$"):  # (the value given)
        SamplingParams(temperature=-1)


def test_a_text_prompt_far_past_the_context_is_refused_before_it_is_tokenized(llm, monkeypatch):
    """10 MB of text was tokenized whole (6 s on two cores, and transformers' warning about its
    length) only to be refused for the context of 256 tokens; the server refuses it by its
    characters first, and with truncate_prompt_tokens tokenizes its tail only. So does LLM now."""
    from minisgl_core.request_limits import ContextLengthExceeded

    text = "word " * 100_000
    whole = list(llm.tokenizer.encode(text))
    lengths = []
    encode = llm.tokenizer.encode
    monkeypatch.setattr(
        llm.tokenizer, "encode", lambda t, *a, **k: lengths.append(len(t)) or encode(t, *a, **k)
    )
    with pytest.raises(ContextLengthExceeded, match=r"^the prompt has 500000 characters, more than can fit"):
        llm.generate(text, SamplingParams(max_tokens=2))
    [out] = llm.generate(text, SamplingParams(max_tokens=2, truncate_prompt_tokens=10))
    assert out.prompt_token_ids == whole[-10:] and out.prompt == text
    assert lengths and max(lengths) < len(text) // 10


def test_a_conversation_far_past_the_context_is_refused_before_it_is_tokenized(llm, monkeypatch):
    """LLM.chat tokenized a huge rendered conversation whole before refusing it as too long, where
    generate refuses such a text prompt by its characters first; chat does too now. One that
    keeps its tail (truncate_prompt_tokens) is taken as before."""
    from minisgl_core.request_limits import ContextLengthExceeded

    huge = [{"role": "user", "content": "word " * 100_000}]
    tokenized = []  # the lengths of the conversations tokenized
    apply = llm.tokenizer.apply_chat_template

    def recording(conversation, *args, **kwargs):
        if kwargs.get("tokenize", True):
            tokenized.append(sum(len(m["content"]) for m in conversation))
        return apply(conversation, *args, **kwargs)

    monkeypatch.setattr(llm.tokenizer, "apply_chat_template", recording)
    short = [{"role": "user", "content": "hi"}]
    says = r"^messages\[1\]: the conversation, as its chat template renders it, has 5000\d\d characters, more than can fit"
    with pytest.raises(ContextLengthExceeded, match=says):
        llm.chat([short, huge], SamplingParams(max_tokens=2))
    assert tokenized == []  # (neither was tokenized: the refusal came first)
    # with truncate_prompt_tokens only the tail its last tokens come from is tokenized (the whole
    # rendered conversation was), and they are the whole one's last tokens (transformers')
    whole = apply(huge, add_generation_prompt=True)
    whole = whole["input_ids"] if isinstance(whole, Mapping) or hasattr(whole, "input_ids") else whole
    lengths = []  # the lengths of the texts tokenized
    encode = llm.tokenizer.encode
    monkeypatch.setattr(
        llm.tokenizer, "encode", lambda t, *a, **k: lengths.append(len(t)) or encode(t, *a, **k)
    )
    [out] = llm.chat(huge, SamplingParams(max_tokens=2, truncate_prompt_tokens=10))
    assert out.prompt_token_ids == list(whole)[-10:] and len(out.prompt) > 500_000
    assert tokenized == [] and lengths and max(lengths) < len(out.prompt) // 10


def test_token_ids_outside_the_vocabulary_are_refused_offline(llm):
    vocab = llm.engine.runner.vocab_size
    with pytest.raises(ValueError, match="^stop_token_ids"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=2, stop_token_ids=[vocab]))
    for prompt in ([1, 2**64], [1, -1], [vocab]):
        with pytest.raises(ValueError, match="prompt token ids"):
            llm.generate([prompt], SamplingParams(max_tokens=2))


# ------------------------------------------------------------------------ temperature


def test_tiny_temperatures_are_raised_as_vllm_does():
    assert SamplingParams(temperature=1e-320).temperature == MIN_TEMPERATURE
    assert SamplingParams(temperature=0.005).temperature == MIN_TEMPERATURE
    assert SamplingParams(temperature=0.5).temperature == 0.5
    assert SamplingParams(temperature=0).greedy


def test_tiny_temperature_samples_the_argmax_not_nan():
    torch.manual_seed(0)
    logits = torch.randn(4, 64)
    logits[:, 17] = logits.max() + 1  # at temperature 0.01, 100 nats ahead: every draw is the argmax
    sampler = Sampler(64, torch.device("cpu"))
    params = SamplingParams(temperature=1e-320)
    result = sampler.sample(logits, [SampleRequest(params, [])] * 4)
    assert result.token_ids.tolist() == [17] * 4


# ------------------------------------------------------------------------ overlap and early stops


def _stop_cases(llm: LLM) -> list[SamplingParams]:
    """Penalised requests that stop early, on a token id and on a string the model does produce."""
    free = llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, frequency_penalty=0.5)
    )
    cases = []
    for out in free:
        token = out.token_ids[2]
        text = llm.tokenizer.decode([token])
        cases.append(
            SamplingParams(temperature=0, max_tokens=12, frequency_penalty=0.5, stop_token_ids=[token])
        )
        if text.strip():
            cases.append(
                SamplingParams(temperature=0, max_tokens=12, presence_penalty=0.5, stop=[text.strip()])
            )
    return cases


@pytest.mark.parametrize("with_seed", [False, True])
def test_penalties_with_early_stops_match_without_overlap(model_dir, llm, with_seed):
    """A request finished by the step in flight must not be sampled again (it used to raise
    'Could not infer dtype of NoneType' building the next step's rows)."""
    cases = _stop_cases(llm)
    if with_seed:
        cases = [
            SamplingParams(**{**vars(p), "temperature": 0.8, "seed": 7 + i}) for i, p in enumerate(cases)
        ]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(cases))]
    # mixed with an unpenalised long request, so some steps overlap and others wait
    prompts.append(PROMPTS[0])
    cases.append(SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2))
    overlapped = llm.generate(prompts, cases)
    with cpu_llm(model_dir, overlap=False) as serial:
        expected = serial.generate(prompts, cases)
    for got, want in zip(overlapped, expected):
        assert (got.token_ids, got.finish_reason, got.matched_stop) == (
            want.token_ids,
            want.finish_reason,
            want.matched_stop,
        )
    if not with_seed:
        assert any(o.finish_reason == "stop" and len(o.token_ids) <= 3 for o in overlapped)
    assert not llm.engine.has_work


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 1.8}, {"presence_penalty": 1.5}, {"frequency_penalty": 1.5}, {"min_tokens": 12}],
)
def test_each_penalty_alone_matches_without_overlap(model_dir, llm, penalty):
    """repetition_penalty alone did not make the engine land the step in flight before sampling:
    the newest token was never penalised, so greedy output under overlap (the default) differed
    from overlap off and from speculative decoding (found by a probe on the default model)."""
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **penalty)
    prompts = [*PROMPTS, [5] * 12, [9, 10] * 6]
    overlapped = [o.token_ids for o in llm.generate(prompts, params)]
    with cpu_llm(model_dir, overlap=False) as serial:
        assert [o.token_ids for o in serial.generate(prompts, params)] == overlapped


# ------------------------------------------------------------------------ close


def test_close_frees_the_kv_pool_and_model_without_the_garbage_collector(model_dir):
    llm = cpu_llm(model_dir)
    llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=3, frequency_penalty=0.1))
    pool = weakref.ref(llm.engine.runner.kv_cache.buffer)
    pool_view = llm.engine.runner.kv_cache.k_cache(0)  # as an attention backend may keep one
    weights = [weakref.ref(p) for p in llm.engine.runner.model.parameters()]
    assert all(w().numel() > 0 for w in weights)
    gc.disable()
    try:
        llm.close()
        assert pool_view.untyped_storage().nbytes() == 0  # the memory is gone though a view lives
        del pool_view
        assert pool() is None
        # each weight is gone, or at least its memory is (a layer may outlive close in a cycle)
        assert all(w() is None or w().numel() == 0 for w in weights)
    finally:
        gc.enable()
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS[:1])
    llm.close()  # twice is fine


# ------------------------------------------------------------------------ an interrupted generate


def test_an_interrupted_generate_leaves_the_llm_usable(llm, monkeypatch):
    """Ctrl-C (or any error) in the middle of ``generate`` left its requests in the engine; every
    later call then failed (KeyError on their outputs). Now they leave with the exception."""
    expected = [o.token_ids for o in llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=6))]
    real_step, steps = llm.engine.step, []

    def interrupted_step():
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(llm.engine, "step", interrupted_step)
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, long)
    monkeypatch.setattr(llm.engine, "step", real_step)
    assert not llm.engine.has_work
    again = llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=6))
    assert [o.token_ids for o in again] == expected


@pytest.fixture
def python_sigint():
    """SIGINT as an interactive Python has it (KeyboardInterrupt), whatever an earlier test in
    this process or the runner that started pytest (a shell's background job inherits it ignored)
    left in place."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("python_sigint")
@pytest.mark.parametrize(
    "where", ["scheduler.schedule", "runner.prepare", "engine._sample", "engine._complete"]
)
@pytest.mark.parametrize("call", [2, 5])
def test_ctrl_c_inside_a_step_leaves_the_llm_usable(llm, monkeypatch, where, call):
    """Ctrl-C landing inside a step (after the scheduler planned it, before its tokens landed) left
    requests counted one token ahead of their ids: the aborts then failed in the cache ("insert_prefix
    needs one slot per token", instead of the KeyboardInterrupt) and the next generate spun forever.
    A real SIGINT, sent from inside the step: the interrupt now waits for the step to end."""
    greedy = SamplingParams(temperature=0, max_tokens=6)
    expected = [o.token_ids for o in llm.generate(PROMPTS, greedy)]
    owner_name, method = where.split(".")
    owner = {"scheduler": llm.engine.scheduler, "runner": llm.engine.runner, "engine": llm.engine}[owner_name]
    real, calls = getattr(owner, method), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode: inside the step
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, method, interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS * 2, SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True, seed=1))
    monkeypatch.setattr(owner, method, real)
    assert not llm.engine.has_work
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy)] == expected


@pytest.mark.usefixtures("python_sigint")
def test_a_second_ctrl_c_stops_the_step_at_once_and_retires_the_llm(model_dir, monkeypatch):
    """The way out of a step that does not end: a second Ctrl-C raises inside it. The engine is
    then not trusted (a half-run step), so the LLM says to create a new one instead of hanging."""
    with cpu_llm(model_dir) as llm:
        real = llm.engine.runner.prepare

        def interrupted(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            return real(*args, **kwargs)

        monkeypatch.setattr(llm.engine.runner, "prepare", interrupted)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(RuntimeError, match="a second Ctrl-C stopped a step half-way; create a new one"):
            llm.generate(PROMPTS[:1])


def test_a_failing_request_takes_the_ones_added_before_it_out(llm):
    """A grammar that fails to compile on the second prompt: the first, already queued, leaves."""
    from minisgl_core.api import GrammarSpec

    good = SamplingParams(temperature=0, max_tokens=4)
    bad = SamplingParams(temperature=0, max_tokens=4, grammar=GrammarSpec("regex", "(("))
    with pytest.raises(ValueError):
        llm.generate(PROMPTS[:2], [good, bad])
    assert not llm.engine.has_work
    assert len(llm.generate(PROMPTS[:1], good)[0].token_ids) == 4


@pytest.mark.parametrize(
    ("prompts", "params", "says"),
    [
        ({1, 2}, None, "prompts must be a str, a list of token ids, a {'prompt': str} or .* got set"),
        (
            {"a": 1},
            None,
            r"a prompt dict takes 'prompt' \(text\) or 'prompt_token_ids'.*'a' is not supported",
        ),
        ("hi", {"temperature": 0}, "sampling_params must be a SamplingParams or a list of them"),
        ("hi", "greedy", "sampling_params must be a SamplingParams or a list of them"),
        # (the element is named: it said "got list" of the list itself, a probe's find)
        ("hi", [None], r"^sampling_params\[0\] must be a SamplingParams, got NoneType: build one"),
        (
            ["a", "b"],
            [SamplingParams(), "greedy"],
            r"^sampling_params\[1\] must be a SamplingParams, got str",
        ),
    ],
)
def test_generate_names_what_it_takes(llm, prompts, params, says):
    with pytest.raises(TypeError, match=says):
        llm.generate(prompts, params)


def test_a_bad_prompt_among_several_is_named_as_chat_names_its_messages(llm):
    """Found by a tester: generate(["Hello", [10**9]]) said "prompt token ids must be integers in
    [0, 1024)" without saying which prompt; so did an empty prompt, a stop token id or logit_bias
    outside the vocabulary, a prompt too long, a grammar that does not compile. The exception's
    class stays; one prompt alone is not named (chat names messages[i] alike)."""
    from minisgl_core.api import GrammarError, GrammarSpec
    from minisgl_core.request_limits import ContextLengthExceeded

    short = SamplingParams(max_tokens=2)
    for prompts, params, kind, says in [
        (["Hello", [10**9]], short, ValueError, "prompts[1]: prompt token ids must be integers in [0, 1024)"),
        ([[5, 6], []], short, ValueError, "prompts[1]: "),
        ([[5], [1.5]], short, TypeError, "prompts[1]: a prompt's token ids must be integers, got float 1.5"),
        ([[5], [6]], [short, SamplingParams(stop_token_ids=[5000])], ValueError, "prompts[1]: stop_token_ids"),
        ([[5], [6]], [SamplingParams(logit_bias={5000: 1}), short], ValueError, "prompts[0]: logit_bias"),
        ([[5], [6] * 300], short, ContextLengthExceeded, "prompts[1]: "),
        ([[5], [6]], [short, SamplingParams(grammar=GrammarSpec("regex", "(("))], GrammarError, "prompts[1]: "),
    ]:  # fmt: skip
        with pytest.raises(kind) as err:
            llm.generate(prompts, params)
        assert type(err.value) is kind or kind is ValueError, err.value
        assert str(err.value).startswith(says), err.value
        assert not llm.engine.has_work
    with pytest.raises(ContextLengthExceeded) as err:  # (one prompt: nothing to tell apart)
        llm.generate([6] * 300, short)
    assert not str(err.value).startswith("prompts")
    assert len(llm.generate([[5], [6]], short)) == 2


def test_get_tokenizer_is_the_llms_tokenizer(llm):
    """vLLM's common call: it was an AttributeError."""
    assert llm.get_tokenizer() is llm.tokenizer


def test_llm_refuses_tensor_parallelism_it_cannot_run(model_dir):
    """LLM(tp_size=2) ran one process, silently."""
    with pytest.raises(ValueError, match="LLM runs one process"):
        LLM(str(model_dir), device="cpu", attn="torch", tp_size=2)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"ignore_eos": "no"}, "ignore_eos must be True or False, got 'no'"),
        ({"skip_special_tokens": 0}, "skip_special_tokens must be True or False, got 0"),
        ({"stop": {"a": 1}}, "stop must be a string or a list of strings, got dict"),
        ({"stop": 5}, "stop must be a string or a list of strings, got int"),
        ({"stop_token_ids": 5}, "stop_token_ids must be a list of token ids, got int"),
        ({"logit_bias": [1, 2]}, "logit_bias must map token ids to biases, got list"),
    ],
)
def test_sampling_params_of_the_wrong_type_are_refused_when_built(fields, says):
    """Each was taken ("no" as True, a dict's keys as stops) or failed later, some after the whole
    generation had run (skip_special_tokens=0, in the tokenizer)."""
    with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
        SamplingParams(**fields)


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ({"page_size": "16"}, "page_size must be an integer (or unset), got '16'"),
        ({"max_running_requests": 1.5}, "max_running_requests must be an integer, got 1.5"),
        ({"attn": None}, "attn must be a string, got None"),
        ({"device": None}, "device must be a string, got None"),
        # (passed for what they were not: "no" is true; a string timeout failed at the first grammar)
        ({"overlap": "no"}, "overlap must be true or false, got 'no'"),
        ({"cascade": 0}, "cascade must be true or false, got 0"),
        ({"grammar_compile_timeout": "5"}, "grammar_compile_timeout must be a number (or unset), got '5'"),
        ({"quantization": 8}, "quantization must be a string (or unset), got 8"),
        ({"kv_memory_fraction": True}, "kv_memory_fraction must be a number, got True"),
    ],
)
def test_llm_options_of_the_wrong_type_name_the_field(model_dir, option, says):
    """Each failed deep in the engine (a comparison of str and int, a torch TypeError) or passed
    for what it was not; every field of a simple annotation is checked by it."""
    with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
        LLM(str(model_dir), **{"device": "cpu", "attn": "torch", **option})


def test_a_plugin_name_to_disable_that_no_plugin_has_is_a_value_error(model_dir):
    """LLM(disable_plugins=["nope"]) raised PluginError, a RuntimeError, where every other bad
    argument of LLM() (attn="nope" among them) is a ValueError."""
    with pytest.raises(ValueError, match=r"^no plugin named 'nope' to disable; installed: "):
        LLM(str(model_dir), device="cpu", attn="torch", disable_plugins=["nope"])
    for given in (None, 5, [5]):  # (the first two were "'int' object is not iterable", naming nothing)
        with pytest.raises(
            TypeError, match=r"^disable_plugins must be a list of installed plugins' names, got "
        ):
            LLM(str(model_dir), device="cpu", attn="torch", disable_plugins=given)


def test_sampling_params_take_numbers_of_any_kind_as_python_ones_but_not_booleans():
    """np.float32(0.5) was "temperature must be a finite number, got np.float32(0.5)", np.int64(3)
    "seed must be an integer in [...]" (vLLM takes them; LLM.encode took numpy ids already). They
    become Python ints and floats, which msgpack and torch take; a bool stays refused."""
    import numpy as np

    params = SamplingParams(
        temperature=np.float32(0.5), top_p=np.float16(0.5), seed=np.int64(3), top_k=np.int32(5),
        max_tokens=np.uint16(7), n=np.int8(2), stop_token_ids=[np.int64(2)], truncate_prompt_tokens=np.int16(4),
        logit_bias={np.int64(3): np.float32(1.5)}, repetition_penalty=Fraction(3, 2),
    )  # fmt: skip
    assert params == SamplingParams(
        temperature=0.5, top_p=0.5, seed=3, top_k=5, max_tokens=7, n=2, stop_token_ids=[2],
        truncate_prompt_tokens=4, logit_bias={3: 1.5}, repetition_penalty=1.5,
    )  # fmt: skip
    for name in ("temperature", "top_p", "repetition_penalty", "seed", "top_k", "max_tokens", "n"):
        assert type(getattr(params, name)) in (int, float), name
    assert [type(v) for v in (*params.stop_token_ids, *params.logit_bias, *params.logit_bias.values())] == [
        int, int, float,
    ]  # fmt: skip
    msgpack.packb(params.to_wire())  # (a numpy value does not cross to the workers)
    for fields, says in [
        ({"seed": True}, "seed must be an integer in [-2**63, 2**63-1], got True"),
        ({"seed": np.bool_(True)}, "seed must be an integer in [-2**63, 2**63-1], got np.True_"),
        ({"temperature": False}, "temperature must be a finite number, got False"),
        ({"top_k": np.float32(2)}, "top_k must be an integer in [-1, 2**63-1], got np.float32(2.0)"),
        ({"temperature": np.float64("nan")}, "temperature must be a finite number, got np.float64(nan)"),
        ({"logit_bias": {1: np.bool_(True)}}, "logit_bias values must be numbers in [-100, 100], got {1: np.True_}"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^{re.escape(says)}$"):
            SamplingParams(**fields)


@pytest.mark.parametrize("key", ["5_0", "٥", " 5 ", "+5", 5.7, True, "5.0", ""])
def test_logit_bias_keys_are_token_ids_not_whatever_int_takes(key):
    """int() read "5_0" as token 50, an Arabic-Indic "٥" as 5, 5.7 as 5 and True as 1."""
    with pytest.raises(ValueError, match="^logit_bias keys must be token ids"):
        SamplingParams(logit_bias={key: 1.0})


def test_logit_bias_keys_as_json_carries_them():
    assert SamplingParams(logit_bias={"50": 1.0, 7: -2.0}).logit_bias == {50: 1.0, 7: -2.0}


def test_a_prompt_with_a_lone_surrogate_says_so(llm):
    """``generate("\\udcff")`` (a non-UTF-8 argument decoded with surrogateescape) raised the
    tokenizer's TypeError, which named no reason."""
    with pytest.raises(ValueError, match=r"not valid text: a lone UTF-16 surrogate '\\udcff' at index 3"):
        llm.generate("abc\udcff")
    assert len(llm.generate("abc", SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2


def test_token_ids_are_integers_of_any_kind_but_not_booleans(llm):
    """[True, False] ran as ids [1, 0]; numpy's integers were "a prompt must be a str or a list of
    token ids, got list" (or int64)."""
    import numpy as np

    greedy = SamplingParams(temperature=0, max_tokens=4)
    expected = llm.generate([PROMPTS[1]], greedy)[0].token_ids
    for prompt in (np.array(PROMPTS[1]).tolist(), list(np.array(PROMPTS[1], dtype=np.int64))):
        assert llm.generate(prompt, greedy)[0].token_ids == expected
        assert llm.generate([prompt], greedy)[0].token_ids == expected
    with pytest.raises(TypeError, match="a prompt's token ids must be integers, got bool True"):
        llm.generate([True, False], greedy)
    with pytest.raises(TypeError, match="a prompt's token ids must be integers, got float 2.0"):
        llm.generate([[1, 2.0]], greedy)


@pytest.mark.parametrize(
    "ids",
    [[5, 1024], [-1, 5], [5] * 500 + [2**70], [5, True, 1024], [5, 2**63]],
    ids=["vocab-last", "negative-first", "huge-last", "bool-among", "int64-max"],
)
def test_a_prompt_id_outside_the_vocabulary_is_refused_wherever_it_is(llm, ids):
    """The range check runs over min and max (the offline workload's 143k ids took 25 ms in a
    Python loop; the ids' types are the caller's, LLM.encode's, checked once: the test above); any
    id outside [0, vocab) still fails, first, last or among a bool, and the prompt passed in stays
    as it was."""
    from minisgl_core.request_limits import check_request_fits

    vocab = llm.engine.limits.vocab_size
    assert vocab == 1024
    params = SamplingParams(max_tokens=1)
    with pytest.raises(ValueError, match=r"prompt token ids must be integers in \[0, 1024\)"):
        check_request_fits(ids, params, vocab_size=vocab, max_context_len=10**6, kv_capacity_tokens=10**6)
    check_request_fits([0, True, 1023], params, vocab_size=vocab, max_context_len=99, kv_capacity_tokens=99)
    if True not in ids:
        before = list(ids)
        with pytest.raises(ValueError, match=r"must be integers in \[0, 1024\)"):
            llm.generate(ids, params)
        assert ids == before
    assert llm.generate([1023, 0], SamplingParams(temperature=0, max_tokens=1))[0].token_ids

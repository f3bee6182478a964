"""Sampling parameters, the sampler's distributions, and stop conditions."""

from __future__ import annotations

import pytest
import torch

from minisgl_core import LLM, SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.runner.sampler import Sampler, SampleRequest, apply_repetition_penalty


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 1.1),
        ("max_tokens", 0),
        ("presence_penalty", 3.0),
        ("frequency_penalty", -2.5),
        ("seed", 1.5),
        ("logprobs", 21),
        ("stop", [""]),
        ("repetition_penalty", 0.0),
        ("logit_bias", {5: 100.5}),
        ("logit_bias", {"not-an-id": 1.0}),
        ("logit_bias", {-1: 1.0}),
        ("logit_bias", {2**63: 1.0}),  # past int64: it could not cross to the workers (was a 500)
    ],
)
def test_bad_values_raise_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_a_stop_string_that_is_not_utf8_is_refused_naming_stop():
    """A lone surrogate was taken, and the scheduler's UnicodeEncodeError came once the request
    was admitted."""
    for stop, which, where in (("a\udfff", 0, 1), (["ok", "\ud800b"], 1, 0)):
        with pytest.raises(ValueError) as err:
            SamplingParams(stop=stop)
        assert str(err.value) == (
            f"stop is not valid text: stop string {which} has a lone UTF-16 surrogate at index {where}"
        )
    assert SamplingParams(stop="\U0001f600").stop == ("\U0001f600",)  # (a pair in UTF-16: fine)


def _draw(logits: torch.Tensor, params: SamplingParams, n: int) -> torch.Tensor:
    sampler = Sampler(logits.shape[-1], torch.device("cpu"))
    batch = logits.expand(n, -1).contiguous()
    return sampler.sample(batch, [SampleRequest(params, [])] * n).token_ids


def _expected(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float
) -> torch.Tensor:
    """vLLM's truncation, step by step as it does it: min-p against the best token, top-k, then
    top-p over the renormalised rest, counted from the smallest token up (a token goes while the
    mass up to and including it is at most 1 - top_p; the largest always stays)."""
    logits = logits / temperature
    probs = torch.softmax(logits, -1)
    logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_k > 0:
        logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
    ascending, order = logits.sort()
    cumulative = torch.softmax(ascending, -1).cumsum(-1)
    gone = cumulative <= 1 - top_p
    gone[-1] = False
    logits[order[gone]] = float("-inf")
    return torch.softmax(logits, -1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [
        (1.0, -1, 1.0, 0.0),
        (0.5, -1, 1.0, 0.0),
        (1.0, 3, 1.0, 0.0),
        (1.0, -1, 0.7, 0.0),
        (1.3, 5, 0.9, 0.1),
        (1.0, 6, 0.8, 0.0),
        (1.0, -1, 0.8, 0.15),
    ],
)
def test_sampled_frequencies_match_the_truncated_distribution(temperature, top_k, top_p, min_p):
    torch.manual_seed(0)
    logits = torch.randn(12) * 1.5
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    tokens = _draw(logits, params, 40000)
    freq = torch.bincount(tokens, minlength=12).float() / len(tokens)
    expected = _expected(logits, temperature, top_k, top_p, min_p)
    assert torch.all(freq[expected == 0] == 0)
    assert torch.allclose(freq, expected, atol=0.012)


def test_top_p_is_a_share_of_what_top_k_and_min_p_leave():
    # the top-4 tokens hold 0.57 of the whole distribution: top-p counted over all of it kept
    # all four (a probe sampled tokens vLLM and transformers never would); over the
    # renormalised four (0.35, 0.26, 0.21, 0.18) 0.8 keeps three
    logits = torch.tensor([0.2, 0.15, 0.12, 0.1] + [0.05] * 8).log()
    expected = _expected(logits, 1.0, 4, 0.8, 0.0)
    assert torch.nonzero(expected).flatten().tolist() == [0, 1, 2]
    tokens = _draw(logits, SamplingParams(temperature=1.0, top_k=4, top_p=0.8), 4000)
    assert set(tokens.tolist()) == {0, 1, 2}


def test_logit_bias_comes_before_the_repetition_penalty():
    # vLLM's order: the biased logit is what the penalty divides; the other order added the bias
    # after it (here token 0: (2 + 2) / 2 = 2 under token 1's 2.5, against 2 / 2 + 2 = 3 above it)
    logits = torch.tensor([[2.0, 2.5]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, logit_bias={0: 2.0})
    sampler = Sampler(2, torch.device("cpu"))
    assert sampler.sample(logits, [SampleRequest(params, [], prompt_ids=[0])]).token_ids.item() == 1


def test_greedy_limits():
    logits = torch.randn(4, 50)
    best = logits.argmax(-1)
    for params in [SamplingParams(temperature=0.0), SamplingParams(top_k=1), SamplingParams(min_p=1.0)]:
        sampler = Sampler(50, torch.device("cpu"))
        assert torch.equal(sampler.sample(logits, [SampleRequest(params, [])] * 4).token_ids, best)


def test_penalties_push_down_repeated_tokens():
    logits = torch.zeros(1, 10)
    logits[0, 3] = 1.0
    sampler = Sampler(10, torch.device("cpu"))
    plain = SamplingParams(temperature=0.0)
    assert sampler.sample(logits, [SampleRequest(plain, [3, 3])]).token_ids.item() == 3
    presence = SamplingParams(temperature=0.0, presence_penalty=1.5)
    assert sampler.sample(logits, [SampleRequest(presence, [3])]).token_ids.item() != 3
    frequency = SamplingParams(temperature=0.0, frequency_penalty=0.6)
    assert sampler.sample(logits, [SampleRequest(frequency, [3])]).token_ids.item() == 3  # 1 - 0.6 > 0
    assert sampler.sample(logits, [SampleRequest(frequency, [3, 3])]).token_ids.item() != 3  # 1 - 1.2 < 0


def test_logprobs_are_log_softmax_of_the_raw_logits():
    logits = torch.randn(2, 30)
    sampler = Sampler(30, torch.device("cpu"))
    params = SamplingParams(temperature=0.7, logprobs=3, seed=1)
    result = sampler.sample(logits, [SampleRequest(params, []), SampleRequest(SamplingParams(), [])])
    token_ids = result.token_ids.tolist()
    lp = result.logprobs(token_ids)
    ref = torch.log_softmax(logits[0], -1)
    assert lp[1] is None
    assert lp[0].logprob == pytest.approx(float(ref[token_ids[0]]), abs=1e-5)
    top = ref.topk(3)
    assert [t for t, _ in lp[0].top] == top.indices.tolist()


def test_scaled_logprobs_are_those_of_the_drawn_distribution_row_by_row():
    """scaled_logprobs (SGLang's /generate): log_softmax of the logits after the penalties, divided
    by the temperature (1 when greedy); rows without it in the same batch keep the raw ones."""
    logits = torch.randn(4, 30, dtype=torch.float64).float()
    sampler = Sampler(30, torch.device("cpu"))
    scaled = SamplingParams(temperature=0.5, logprobs=2, seed=1, scaled_logprobs=True)
    greedy = SamplingParams(temperature=0.0, logprobs=2, frequency_penalty=1.5, scaled_logprobs=True)
    raw = SamplingParams(temperature=0.5, logprobs=2, seed=1)
    requests = [SampleRequest(raw, []), SampleRequest(scaled, []), SampleRequest(SamplingParams(), []),
                SampleRequest(greedy, [4, 4])]  # fmt: skip
    result = sampler.sample(logits, requests)
    token_ids = result.token_ids.tolist()
    lp = result.logprobs(token_ids)
    penalised = logits[3].clone()
    penalised[4] -= 2 * 1.5
    refs = [torch.log_softmax(logits[0], -1), torch.log_softmax(logits[1] / 0.5, -1), None,
            torch.log_softmax(penalised, -1)]  # fmt: skip
    assert lp[2] is None
    for row in (0, 1, 3):
        ref = refs[row]
        assert lp[row].logprob == pytest.approx(float(ref[token_ids[row]]), abs=1e-5), row
        assert [t for t, _ in lp[row].top] == ref.topk(2).indices.tolist(), row
        assert [v for _, v in lp[row].top] == pytest.approx(ref.topk(2).values.tolist(), abs=1e-5)
    with pytest.raises(ValueError, match="scaled_logprobs must be True or False"):
        SamplingParams(scaled_logprobs=1)


def test_sampled_tokens_carry_their_vocabulary_rank():
    """1 + the tokens more likely than the one drawn (random logits: no ties), as vLLM counts;
    hot sampling over many rows draws tokens of many ranks."""
    torch.manual_seed(0)
    logits = torch.randn(64, 30)
    sampler = Sampler(30, torch.device("cpu"))
    params = SamplingParams(temperature=2.0, logprobs=0)
    result = sampler.sample(logits, [SampleRequest(params, [])] * 64)
    token_ids = result.token_ids.tolist()
    ref = torch.log_softmax(logits, -1)
    expected = [1 + int((ref[i] > ref[i, t]).sum()) for i, t in enumerate(token_ids)]
    assert [lp.rank for lp in result.logprobs(token_ids)] == expected
    assert len(set(expected)) > 3


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")
    return LLM(d, attn="torch", device="cpu", dtype="float32")


def test_seeded_requests_do_not_depend_on_batch(llm):
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=1234, ignore_eos=True)
    alone = llm.generate(["one two three"], params)[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    batch = llm.generate(["x", "one two three", "the cat"], [others, params, others])
    assert batch[1].token_ids == alone
    assert (
        llm.generate(
            ["one two three"], SamplingParams(temperature=1.0, max_tokens=10, seed=99, ignore_eos=True)
        )[0].token_ids
        != alone
    )


def test_stop_token_ids_eos_and_ignore_eos(llm):
    base = llm.generate(["hello there"], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0]
    stop_at = base.token_ids[3]
    out = llm.generate(
        ["hello there"], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_at])
    )[0]
    first = base.token_ids.index(stop_at)
    assert out.finish_reason == "stop" and out.matched_stop == stop_at
    assert out.token_ids == base.token_ids[: first + 1]
    # eos from generation_config.json stops too, unless ignore_eos
    llm.engine.scheduler.stop_checker.eos_ids = frozenset({stop_at})
    try:
        out = llm.generate(["hello there"], SamplingParams(temperature=0.0, max_tokens=10))[0]
        assert out.finish_reason == "stop" and len(out.token_ids) == first + 1
        out = llm.generate(["hello there"], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[
            0
        ]
        assert out.finish_reason == "length" and out.token_ids == base.token_ids
    finally:
        llm.engine.scheduler.stop_checker.eos_ids = frozenset(llm.engine.eos_ids)


def test_stop_strings_end_generation_and_are_trimmed(llm):
    base = llm.generate(["hello there"], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))[0]
    text = base.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip()
    out = llm.generate(
        ["hello there"], SamplingParams(temperature=0.0, max_tokens=16, stop=[stop], ignore_eos=True)
    )[0]
    assert out.finish_reason == "stop" and out.matched_stop == stop
    assert out.text == text[: text.index(stop)]
    assert len(out.token_ids) < len(base.token_ids)


def test_of_several_stop_strings_the_first_in_the_text_wins(llm):
    """One token can hold two stop strings: the text ends at the one it reaches first, not at the
    first of the list (["d", "a"] cut "-and" to "-an"; OpenAI and vLLM give "-")."""
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    base = llm.generate(["hello there"], params)[0]
    tokens = [llm.tokenizer.decode(base.token_ids[: i + 1]) for i in range(len(base.token_ids))]
    pick = None
    for i, upto in enumerate(tokens):
        before = tokens[i - 1] if i else ""
        new = [c for c in dict.fromkeys(upto[len(before) :]) if c.strip() and c not in before]
        if len(new) >= 2 and upto.startswith(before):
            pick = new[0], new[1]
            break
    if pick is None:
        pytest.skip(f"no token brings two new characters in {base.text!r}")
    first, second = pick
    for stop in ([second, first], [first, second]):
        out = llm.generate(["hello there"], SamplingParams(**{**vars(params), "stop": stop}))[0]
        assert out.matched_stop == first and out.finish_reason == "stop", (stop, out.matched_stop)
        assert out.text == base.text[: base.text.index(first)], (stop, out.text)


def test_min_tokens_bans_stop_tokens_until_reached(llm):
    """vLLM's min_tokens: before it, neither a stop token id nor eos can be sampled (the tokens are
    greedy decoding with them biased away) and nothing stops the request; from it on they stop it."""
    prompt = ["hello there"]
    base = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop_at = base.token_ids[1]
    banned = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logit_bias={stop_at: -100})
    )[0]
    out = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_at], min_tokens=6)
    )[0]
    assert out.token_ids[:6] == banned.token_ids[:6] and stop_at not in out.token_ids[:6]
    assert len(out.token_ids) >= 6
    assert out.finish_reason == ("stop" if stop_at in out.token_ids else "length")
    # the same with stop_at as the model's eos (unless ignore_eos, which leaves eos alone)
    llm.engine.scheduler.stop_checker.eos_ids = frozenset({stop_at})
    try:
        as_eos = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6))[0]
        assert as_eos.token_ids[:6] == banned.token_ids[:6]
        free = llm.generate(
            prompt, SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6, ignore_eos=True)
        )[0]
        assert free.token_ids == base.token_ids
    finally:
        llm.engine.scheduler.stop_checker.eos_ids = frozenset(llm.engine.eos_ids)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)


def test_min_tokens_ignores_stop_strings_before_it(llm):
    """A stop string in the text of the first min_tokens - 1 tokens does not count (nor is the
    text cut there): the request goes on to the next occurrence ending after that text, or to
    max_tokens."""
    prompt = ["hello there"]
    base = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0]
    text, ids = base.text, base.token_ids
    pairs = [text[i : i + 2] for i in range(len(text) - 1)]
    stop = next((p for p in pairs if p.isprintable() and p.strip() and text.count(p) >= 2), None)
    if stop is None:
        pytest.skip(f"no repeated two-character piece in {text!r}")

    def search_start(min_tokens: int) -> int:  # the rule the detokenizer and the stop checker share
        if min_tokens <= 1:
            return 0
        return max(0, len(llm.tokenizer.decode(ids[: min_tokens - 1])) - len(stop) + 1)

    # the fewest tokens that skip the first occurrence
    past_first = next(m for m in range(2, 25) if search_start(m) > text.find(stop))
    for min_tokens in (0, past_first, 24):
        params = SamplingParams(
            temperature=0.0, max_tokens=24, stop=[stop], ignore_eos=True, min_tokens=min_tokens
        )
        out = llm.generate(prompt, params)[0]
        at = text.find(stop, search_start(min_tokens))
        assert out.text == (text[:at] if at >= 0 else text), (min_tokens, stop, text)
        assert out.finish_reason == ("stop" if at >= 0 else "length")
        assert out.token_ids == ids[: len(out.token_ids)] and len(out.token_ids) >= min_tokens


def test_generation_config_supplies_defaults_for_unset_fields(tmp_path):
    """The model's generation_config.json fills the fields a request leaves unset, offline and in the
    server's admission of a real HTTP body (parsed by the server's own schema: the schema must leave
    unset fields None, or the model's defaults could never apply)."""
    import json

    from minisgl_core.messages import Limits, TokenizeRequest, decode, encode
    from minisgl_core.processes.text_workers import Admitter
    from minisgl_core.server.handling import sampling_params
    from minisgl_core.server.schemas import ChatCompletionRequest, CompletionRequest, GenerateRequest
    from minisgl_core.server.state import ModelInfo

    d = make_model_dir(tmp_path / "m", "LlamaForCausalLM")
    gen = json.loads((d / "generation_config.json").read_text())
    gen |= {"temperature": 0.0, "top_k": 7, "max_new_tokens": 5, "repetition_penalty": 1.1}
    (d / "generation_config.json").write_text(json.dumps(gen))
    llm = LLM(d, attn="torch", device="cpu", dtype="float32")
    assert llm.engine.sampling_defaults == {
        "temperature": 0.0,
        "top_k": 7,
        "repetition_penalty": 1.1,
        "max_tokens": 5,
    }
    # no SamplingParams: the model's greedy default applies, so two runs agree, and equal greedy
    a, b = (llm.generate(["the cat sat"])[0].token_ids for _ in range(2))
    greedy = llm.generate(
        ["the cat sat"], SamplingParams(temperature=0.0, max_tokens=5, repetition_penalty=1.1)
    )[0].token_ids
    assert a == b == greedy and len(a) <= 5
    # precedence offline: given > model > SamplingParams' own
    params = llm.sampling_params(top_p=0.5, temperature=None)
    assert (params.temperature, params.top_k, params.top_p, params.min_p, params.max_tokens) == (
        0.0,
        7,
        0.5,
        0.0,
        5,
    )
    assert llm.sampling_params(temperature=0.9).temperature == 0.9

    # the server: the API builds the request's SamplingParams with the model's defaults, the
    # tokenizer's admission decides max_tokens (at most the model's default)
    defaults = llm.engine.sampling_defaults
    info = ModelInfo("m", str(d), 512, 4096, 1024, defaults)
    admitter = Admitter(llm.tokenizer, Limits(512, 4096, 1024), defaults)

    def admit(body, model: ModelInfo = info, admitter: Admitter = admitter) -> SamplingParams:
        field = getattr(body, "max_tokens_field", "sampling_params.max_new_tokens")
        fields = (
            body.items()[0].sampling_fields() if isinstance(body, GenerateRequest) else body.sampling_fields()
        )
        params = sampling_params(fields, {}, model)
        req = TokenizeRequest([0], None, None, [5, 6, 7], params, field)
        return admitter.admit(decode(encode(req)))[1]

    unset = admit(CompletionRequest(prompt=[5, 6, 7], top_p=0.5))
    assert (unset.temperature, unset.top_k, unset.top_p, unset.min_p, unset.max_tokens) == (
        0.0,
        7,
        0.5,
        0.0,
        5,
    )
    chat = admit(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], temperature=None))
    assert (chat.temperature, chat.top_k) == (0.0, 7)
    explicit = admit(CompletionRequest(prompt=[5, 6, 7], temperature=0.9, top_k=-1, max_tokens=9))
    assert (explicit.temperature, explicit.top_k, explicit.max_tokens) == (0.9, -1, 9)
    native = admit(GenerateRequest(input_ids=[5, 6, 7], sampling_params={"top_p": 0.8}))
    assert (native.temperature, native.top_k, native.top_p) == (0.0, 7, 0.8)
    # a model without defaults: the OpenAI ones (temperature 1, no truncation)
    bare = Admitter(llm.tokenizer, Limits(512, 4096, 1024), {})
    plain = admit(CompletionRequest(prompt=[5]), ModelInfo("m", str(d), 512, 4096, 1024), bare)
    assert (plain.temperature, plain.top_k, plain.top_p, plain.min_p) == (1.0, -1, 1.0, 0.0)
    assert plain.max_tokens == 512 - 3  # what the context leaves


def test_a_model_default_max_tokens_past_the_context_caps_generate_without_sampling_params(tmp_path):
    """generate(prompts) without SamplingParams took the model's max_new_tokens (1000) as the
    request's own max_tokens and raised ContextLengthExceeded on a context of 64, where the server
    answers the same unset request with what the context leaves; now it is the server's cap, and
    llm.sampling_params() caps it too."""
    import json

    d = make_model_dir(tmp_path / "m", "LlamaForCausalLM", max_position_embeddings=64)
    gen = json.loads((d / "generation_config.json").read_text()) | {
        "max_new_tokens": 1000,
        "temperature": 0.0,
    }
    (d / "generation_config.json").write_text(json.dumps(gen))
    with LLM(d, attn="torch", device="cpu", dtype="float32") as llm:
        [out] = llm.generate([[5] * 60])
        assert 1 <= len(out.token_ids) <= 4
        assert (
            out.token_ids
            == llm.generate([[5] * 60], SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids
        )
        # llm.sampling_params() took the 1000 as it was, so every prompt was refused with it: now
        # capped as admission caps it, at what the context leaves the shortest prompt
        params = llm.sampling_params(temperature=0.0)
        assert params.max_tokens == 63
        assert len(llm.generate([[5]], params)[0].token_ids) <= 63
        assert llm.sampling_params(max_tokens=7).max_tokens == 7  # (one given is taken as it is)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("auto", {"temperature": 0.3}),
        ("none", {}),
        ("vllm", {}),
        ("DIR", {"top_p": 0.4, "max_tokens": 3}),
        # the file itself (it said "no generation_config.json there")
        ("FILE", {"top_p": 0.4, "max_tokens": 3}),
    ],
)
def test_generation_config_setting_picks_the_source(tmp_path, setting, expected):
    import json

    from minisgl_core.checkpoint.generation_defaults import load_sampling_defaults

    model = tmp_path / "model"
    model.mkdir()
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "eos_token_id": 2}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"top_p": 0.4, "max_new_tokens": 3}))
    given = {"DIR": str(other), "FILE": str(other / "generation_config.json")}.get(setting, setting)
    assert load_sampling_defaults(model, given) == expected


def test_bad_generation_config_is_a_clear_error(tmp_path):
    import json

    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError, load_sampling_defaults

    with pytest.raises(GenerationConfigError, match="no generation_config.json there"):
        load_sampling_defaults(tmp_path, str(tmp_path / "missing"))
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    with pytest.raises(GenerationConfigError, match="temperature must be >= 0"):
        load_sampling_defaults(tmp_path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(
        GenerationConfigError, match="generation_config.json is not JSON .*; fix it, or remove it"
    ):
        load_sampling_defaults(tmp_path)


def test_a_generation_config_that_is_no_object_is_a_clear_error(tmp_path):
    """JSON, but a list: an AttributeError from generate, serve and LLM (the --generation-config
    FOLDER path refused it already)."""
    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError, load_sampling_defaults

    model = make_model_dir(tmp_path / "llama", "LlamaForCausalLM")
    (model / "generation_config.json").write_text("[1]")
    with pytest.raises(GenerationConfigError) as err:
        load_sampling_defaults(model)
    says = f"{model / 'generation_config.json'} must hold a JSON object, got list; fix it, or remove it"
    assert str(err.value) == says
    # the end-of-sequence ids are read from it whatever generation_config says
    for setting in ("auto", "none"):
        with pytest.raises(GenerationConfigError) as err:
            LLM(model, attn="torch", device="cpu", generation_config=setting)
        assert str(err.value) == says


@pytest.mark.parametrize(
    "file, value",
    [
        ("generation_config.json", ["x"]),
        ("generation_config.json", "2"),
        ("generation_config.json", [2, -5]),
        ("config.json", 2.5),
        ("config.json", [1, True]),
    ],
)
def test_an_eos_token_id_that_is_no_token_id_is_a_clear_error(tmp_path, file, value):
    """``["x"]`` was an ``int()`` traceback from LLM and serve; ``"2"`` was ignored and ``2.5``
    truncated to 2 (generation that does not stop where the model ends, or stops elsewhere); -5
    banned token ``vocab - 5`` under ``min_tokens``."""
    import json

    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError

    model = make_model_dir(tmp_path / "llama", "LlamaForCausalLM")
    path = model / file
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, "eos_token_id": value}))
    with pytest.raises(GenerationConfigError) as err:
        LLM(model, attn="torch", device="cpu", generation_config="none")
    assert str(err.value) == (
        f"{path}: eos_token_id must be a token id (an integer >= 0) or a list of them, got {value!r}; "
        "fix it, or remove the key"
    )


def test_an_eos_token_id_outside_the_vocabulary_is_dropped(tmp_path, caplog):
    """An id the model cannot produce ends nothing; a request's ``min_tokens`` banned it by index
    into the logits (out of range at the step), and the grammar backends refused it (a review's find)."""
    import json

    from minisgl_core.sampling import SamplingParams

    model = make_model_dir(tmp_path / "llama", "LlamaForCausalLM")
    config = json.loads((model / "config.json").read_text())
    vocab = config["vocab_size"]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, vocab, 2**70]}))
    with caplog.at_level("WARNING"):
        llm = LLM(model, attn="torch", device="cpu")
    try:
        assert 1 in llm.engine.eos_ids and max(llm.engine.eos_ids) < vocab
        assert (
            f"end-of-sequence id(s) [{vocab}, {2**70}] are outside the vocabulary of {vocab}" in caplog.text
        )
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, min_tokens=3, temperature=0))
        assert len(out[0].token_ids) >= 3
    finally:
        llm.close()


def test_a_generation_config_that_cannot_be_read_is_a_clear_error(tmp_path, monkeypatch):
    """One without read permission was an OSError traceback from LLM with
    ``generation_config="none"`` (root reads any file: the permission error is raised here)."""
    import pathlib

    from minisgl_core.checkpoint.generation_defaults import GenerationConfigError

    model = make_model_dir(tmp_path / "llama", "LlamaForCausalLM")
    (model / "generation_config.json").write_text("{}")
    read_text = pathlib.Path.read_text

    def refuse(self, *args, **kwargs):
        if self.name == "generation_config.json":
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", refuse)
    for setting in ("auto", "none"):
        with pytest.raises(
            GenerationConfigError,
            match=r"generation_config.json is unreadable \(.*Permission denied.*\); fix it, or remove it",
        ):
            LLM(model, attn="torch", device="cpu", generation_config=setting)


@pytest.mark.parametrize("rows, vocab", [(1, 5), (3, 2048), (4, 2049), (2, 151936), (5, 4097)])
def test_chunked_argmax_is_argmax(rows, vocab):
    """The two-stage argmax the sampler uses (chunks of the vocabulary, then the chunks' maxima)
    equals torch's, ties included: the first maximum wins, also across chunk boundaries."""
    from minisgl_core.runner.sampler import _CHUNK, _chunked_argmax

    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab))
    assert torch.equal(_chunked_argmax(x), x.argmax(-1))
    tied = torch.zeros(rows, vocab)
    tied[:, -1] = tied[:, vocab // 2] = tied[:, min(_CHUNK, vocab - 1)] = 1.0
    assert torch.equal(_chunked_argmax(tied), tied.argmax(-1))
    flat = torch.full((rows, vocab), -3.0, dtype=torch.bfloat16)
    assert torch.equal(_chunked_argmax(flat), torch.zeros(rows, dtype=torch.int64))


_TRITON_DRAW = """
import torch
from minisgl_core.testing.triton_interpreter import tolerate_one_element_scalars
tolerate_one_element_scalars()
from minisgl_core.runner.sampler import gumbel_argmax_chunked, gumbel_max_chunked, _CHUNK
device, rows, seeds, tolerance = {args}
vocab = 2 * _CHUNK + 37
logits = torch.full((vocab,), -40.0, device=device)
hot = torch.tensor([3, _CHUNK - 1, _CHUNK, 2 * _CHUNK + 36], device=device)
logits[hot] = torch.tensor([0.5, 1.0, 0.0, 1.5], device=device)
scale = torch.full((rows,), 1 / 0.7, device=device)
noise = torch.ones(rows, device=device)
draws = torch.cat([gumbel_argmax_chunked(logits.expand(rows, vocab).bfloat16(), scale, noise, seed) for seed in seeds])
freq = torch.stack([(draws == h).float().mean() for h in hot])
expected = torch.softmax(logits[hot].bfloat16().float() / 0.7, 0)
assert (draws[:, None] == hot).any(1).all()
assert (freq - expected).abs().max() < tolerance, (freq, expected)
assert not torch.equal(draws[:rows], draws[rows : 2 * rows])  # another seed, other draws
greedy = gumbel_argmax_chunked(logits.expand(3, vocab), torch.ones(3, device=device), torch.zeros(3, device=device), 5)
assert greedy.tolist() == [2 * _CHUNK + 36] * 3
# chunks per program do not change the draw: the same noise per id, ties to the first id
mixed = torch.randn(5, vocab, device=device).bfloat16()
mixed[1] = 0.0  # a greedy row of ties
mixed[2, :_CHUNK + 5] = mixed[2, _CHUNK + 5 :].max()  # ties between a span's lanes and later ones
mixed[3] = float("-inf")  # nothing allowed: index 0, as torch's argmax
mixed[4, 7] = mixed[4, 2 * _CHUNK + 36] = 30.0
noise = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], device=device)
spans = [gumbel_max_chunked(mixed, torch.ones(5, device=device), noise, 9, span) for span in (1, 2, 4)]
assert all(torch.equal(spans[0][0], v) and torch.equal(spans[0][1], i) for v, i in spans[1:])
assert spans[0][1][1:].tolist() == mixed[1:].float().argmax(-1).tolist() == [0, 0, 0, 7]
# a chunk is picked by its whole mass, not its best id: one id of logit log(20) in chunk 0 against
# twenty ids of logit 0 in chunk 2 is an even race (a pick by the chunks' maxima: 0.95 for chunk 0);
# the winning key is distributed as the one-level race's largest, Gumbel(logsumexp): mean + 0.5772
spread = torch.full((vocab,), -40.0, device=device)
spread[5] = torch.tensor(20.0).log()
spread[2 * _CHUNK : 2 * _CHUNK + 20] = 0.0
ones = torch.ones(rows, device=device)
won = [gumbel_max_chunked(spread.expand(rows, vocab), ones, ones, seed) for seed in seeds]
ids, keys = torch.cat([i for _, i in won]), torch.cat([v for v, _ in won])
assert ((ids == 5) | ((ids >= 2 * _CHUNK) & (ids < 2 * _CHUNK + 20))).all()
share = (ids == 5).float().mean().item()
assert abs(share - 0.5) < tolerance, share
mean_key = keys.mean().item() - torch.logsumexp(spread, 0).item()
assert abs(mean_key - 0.5772) < 3 * tolerance, mean_key
print("ok", freq.tolist(), expected.tolist(), share, mean_key)
"""


@pytest.mark.parametrize("device", ["interpreter", "cuda"])
def test_triton_gumbel_draw_matches_softmax(device):
    """The sampler's Triton Gumbel-max kernels over bf16 logits: draws follow softmax(logits *
    scale) across chunk boundaries, a chunk is picked by its whole mass, the winning key is the
    race's largest, two seeds draw differently, noise_scale 0 is the argmax. On
    the CPU under Triton's interpreter in a child process (slow: 400 draws, loose bound); on the
    GPU with 40,000 draws (standard error below 0.0025)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    env = dict(os.environ)
    if device == "interpreter":
        env["TRITON_INTERPRET"] = "1"
        args = "'cpu', 200, (1, 2), 0.1"
    else:
        args = "'cuda', 20000, (1, 2), 0.012"
    code = _TRITON_DRAW.replace("{args}", args)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_two_level_torch_draw_matches_softmax_across_chunks():
    """The Gumbel-max race in two levels in torch ops (:func:`gumbel_max_two_level`, the CPU's
    draw): ids follow softmax(logits * scale) across chunk boundaries, a chunk is picked by its
    whole mass (one id of logit log 20 against twenty of 0 in another chunk: even), the winning key
    is distributed as the one-level race's largest (mean logsumexp + 0.5772), a generator makes it
    repeatable, and noise_scale 0 is torch's argmax (ties to the first id; nothing allowed: 0)."""
    from minisgl_core.runner.sampler import _CHUNK, gumbel_max_two_level

    vocab, rows = 2 * _CHUNK + 37, 3000
    logits = torch.full((vocab,), -40.0)
    hot = torch.tensor([3, _CHUNK - 1, _CHUNK, 2 * _CHUNK + 36])
    logits[hot] = torch.tensor([0.5, 1.0, 0.0, 1.5])
    scale, ones = torch.full((rows,), 1 / 0.7), torch.ones(rows)
    generator = torch.Generator().manual_seed(0)
    _, ids = gumbel_max_two_level(logits.expand(rows, vocab), scale, ones, generator)
    assert (ids[:, None] == hot).any(1).all()
    freq = (ids[:, None] == hot).float().mean(0)
    assert (freq - torch.softmax(logits[hot] / 0.7, 0)).abs().max() < 0.04, freq
    again = gumbel_max_two_level(logits.expand(rows, vocab), scale, ones, torch.Generator().manual_seed(0))[1]
    assert torch.equal(ids, again)
    spread = torch.full((vocab,), -40.0)
    spread[5] = torch.tensor(20.0).log()
    spread[2 * _CHUNK : 2 * _CHUNK + 20] = 0.0
    keys, ids = gumbel_max_two_level(spread.expand(rows, vocab), ones, ones, generator)
    assert ((ids == 5) | ((ids >= 2 * _CHUNK) & (ids < 2 * _CHUNK + 20))).all()
    assert abs((ids == 5).float().mean().item() - 0.5) < 0.04
    assert abs(keys.mean().item() - torch.logsumexp(spread, 0).item() - 0.5772) < 0.1
    mixed = torch.randn(4, vocab)
    mixed[0] = 0.0  # ties
    mixed[1, : _CHUNK + 5] = mixed[1, _CHUNK + 5 :].max()  # ties across a chunk boundary
    mixed[2] = float("-inf")  # nothing allowed
    mixed[3, 7] = mixed[3, 2 * _CHUNK + 36] = 30.0
    keys, ids = gumbel_max_two_level(mixed, torch.ones(4), torch.zeros(4))
    assert ids.tolist() == mixed.argmax(-1).tolist() == [0, 0, 0, 7]
    assert torch.equal(keys[[0, 1, 3]], mixed[[0, 1, 3]].max(-1).values)


def test_repetition_penalty_matches_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(2, 64)
    prompt, output = [1, 5, 7, 5], [7, 9, 63]
    reference = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits[:1].clone())
    penalized = SampleRequest(SamplingParams(repetition_penalty=1.3), output, None, prompt)
    ours = apply_repetition_penalty(logits, [penalized, SampleRequest(SamplingParams(), [9], None, [1])])
    assert torch.allclose(ours[0], reference[0])
    assert torch.equal(ours[1], logits[1])  # a request without the penalty is untouched


def test_logit_bias_forces_and_bans_tokens():
    torch.manual_seed(0)
    logits = torch.randn(1, 64)
    best = int(logits.argmax())
    forced = SamplingParams(temperature=0.0, logit_bias={"17": 100})  # string keys, as JSON sends them
    assert _draw(logits, forced, 1).tolist() == [17]
    banned = SamplingParams(temperature=1.0, logit_bias={best: -100})
    assert best not in _draw(logits, banned, 200).tolist()
    plain = _draw(logits, SamplingParams(temperature=0.0), 1)
    assert plain.tolist() == [best]


def test_grammar_and_logit_bias_survive_the_wire():
    """The tokenizer sends SamplingParams as their field values in msgpack; the scheduler rebuilds
    the same frozen object."""
    import dataclasses

    from minisgl_core.api import GrammarSpec
    from minisgl_core.messages import EngineRequest, decode, encode

    params = SamplingParams(
        grammar=GrammarSpec("json_schema", '{"type": "array"}'),
        logit_bias={"7": -3.5},
        repetition_penalty=1.2,
        stop=["a", "b"],
        stop_token_ids=[3],
    )
    received = decode(encode(EngineRequest(1, [1, 2], params)))
    assert received.params == params and received.params.stop == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        received.params.temperature = 0.0  # type: ignore[misc]
    assert params.grammar == GrammarSpec("json_schema", '{"type": "array"}') and params.logit_bias == {
        7: -3.5
    }


def test_integers_of_any_size_survive_the_wire():
    """JSON integers have no size limit (a tool's schema, chat_template_kwargs); msgpack stops at
    64 bits, so larger ones travel as an extension and come back equal (a 500 before)."""
    from minisgl_core.messages import TokenizeRequest, decode, encode

    values = [-(2**63) - 1, 2**64, 10**30, -(10**40), 2**63 - 1, -(2**63), 2**64 - 1, True, 0]
    args = {"tools": [{"parameters": {"const": values[0], "enum": values}}], "deep": [[{"x": 10**25}]]}
    received = decode(encode(TokenizeRequest([1], None, [{"role": "user", "content": "hi"}], None,
                                             SamplingParams(), template_args=args)))  # fmt: skip
    assert received.template_args == args
    enum = received.template_args["tools"][0]["parameters"]["enum"]
    assert [type(v) for v in enum] == [type(v) for v in values]  # True stays a bool


def test_a_requests_priority_travels_and_old_encodings_read_as_0():
    """TokenizeRequest and EngineRequest carry the request's priority (last, so a message encoded
    before it existed decodes with priority 0); the scheduler's request and its view get it."""
    import msgpack

    from minisgl_core.messages import EngineRequest, TokenizeRequest, decode, encode
    from minisgl_core.scheduler.request import Request

    tokenize = TokenizeRequest([1], "hi", None, None, SamplingParams(max_tokens=3), priority=-(2**63))
    assert decode(encode(tokenize)).priority == -(2**63)
    engine = decode(encode(EngineRequest(1, [5, 6], SamplingParams(max_tokens=3), 2**63 - 1)))
    assert engine.priority == 2**63 - 1
    request = Request(1, engine.prompt_ids, engine.params, 0, priority=engine.priority)
    assert request.view().priority == 2**63 - 1
    # [tag, rid, prompt_ids, params]: the encoding without the field (nor cache_salt and
    # prediction_ids, after it)
    old = msgpack.unpackb(encode(EngineRequest(1, [5, 6], SamplingParams(max_tokens=3), 9, 77, [3])))[:-3]
    assert decode(msgpack.packb(old)).priority == 0


def test_a_requests_cache_salt_travels_and_old_encodings_read_as_0():
    """The cache salt's key rides last on TokenizeRequest and EngineRequest (a message encoded
    before it existed decodes with 0, no salt); the scheduler's request keys the cache by it."""
    import msgpack

    from minisgl_core.messages import EngineRequest, TokenizeRequest, decode, encode
    from minisgl_core.request_limits import cache_salt_key

    key = cache_salt_key("tenant")
    tokenize = TokenizeRequest(
        [1], "hi", None, None, SamplingParams(max_tokens=3), priority=2, cache_salt=key
    )
    assert (decode(encode(tokenize)).priority, decode(encode(tokenize)).cache_salt) == (2, key)
    engine = decode(encode(EngineRequest(1, [5, 6], SamplingParams(max_tokens=3), 4, key)))
    assert (engine.priority, engine.cache_salt) == (4, key)
    # (without it and prediction_ids, after it)
    old = msgpack.unpackb(encode(EngineRequest(1, [5, 6], SamplingParams(max_tokens=3), 4, key, [3])))[:-2]
    assert (decode(msgpack.packb(old)).priority, decode(msgpack.packb(old)).cache_salt) == (4, 0)
    assert decode(msgpack.packb(old)).prediction_ids is None


def test_triton_draw_does_not_compile_per_seed():
    """The seed of the Gumbel-max kernel changes at every sampling call; Triton must not
    specialise on it, or a seed divisible by 16 (or equal to 1) compiles a new variant mid-run (a
    0.6–1 s stall seen in the offline benchmark's step trace on the GPU). The other scalar
    arguments are fixed by the model (row stride, vocabulary, chunk count)."""
    pytest.importorskip("triton")
    from minisgl_core.runner._sampler_triton import chunk_race_kernel, chunk_stats_kernel

    unspecialised = {p.name for p in chunk_race_kernel.params if p.do_not_specialize}
    assert unspecialised == {"seed"}
    assert "seed" not in {p.name for p in chunk_stats_kernel.params}


def test_the_race_scales_rows_start_aligned_at_every_batch_size():
    """The Gumbel-max kernel reads the two scale rows by pointer; Triton compiles a variant per
    16-byte alignment of a pointer, so a row starting 4 × batch-size bytes into one buffer compiled
    new variants mid-run on the GPU (the offline benchmark fell from 26.1k to 19.8k tok/s, its
    step trace full of 0.6 s sampling steps). Both rows must start aligned whatever the batch."""
    from minisgl_core.runner.sampler import _race_scales

    hot, greedy = SamplingParams(temperature=0.5), SamplingParams(temperature=0.0)
    for n in range(1, 41):
        params = [hot if i % 3 else greedy for i in range(n)]
        scale, noise_scale = _race_scales(params, torch.device("cpu"))
        assert scale.data_ptr() % 64 == 0 and noise_scale.data_ptr() % 64 == 0
        assert scale.tolist() == [2.0 if i % 3 else 1.0 for i in range(n)]
        assert noise_scale.tolist() == [1.0 if i % 3 else 0.0 for i in range(n)]


@pytest.mark.parametrize("constrained_rows", [[0, 1], [1]], ids=["every-row", "one-row"])
def test_logprobs_of_a_constrained_row_are_shares_of_what_its_grammar_allows(constrained_rows):
    # vLLM's: the grammar's mask is applied to the logits the logprobs come from (they were the
    # unmasked model's: a json_object answer's "{" at -13 with "The", "L", "La" as its top
    # alternatives); a forbidden token is reported at -9999.0, JSON having no -inf
    from minisgl_core.api import allocate_token_bitmask
    from minisgl_core.runner.sampler import FORBIDDEN_LOGPROB

    torch.manual_seed(3)
    vocab = 40
    logits = torch.randn(2, vocab)
    allowed = [5, 17, 33]
    bitmask = allocate_token_bitmask(len(constrained_rows), vocab)
    bitmask.zero_()
    for token in allowed:
        bitmask[:, token // 32] |= 1 << (token % 32)
    params = SamplingParams(temperature=0.0, logprobs=5)
    sampler = Sampler(vocab, torch.device("cpu"))
    result = sampler.sample(
        logits.clone(),
        [SampleRequest(params, []), SampleRequest(params, [])],
        (torch.tensor(constrained_rows), bitmask),
    )
    tokens = result.token_ids.tolist()
    for row, logprob in enumerate(result.logprobs(tokens)):
        if row in constrained_rows:
            shares = torch.log_softmax(logits[row, allowed], -1)
            assert tokens[row] == allowed[int(shares.argmax())]
            assert logprob.logprob == pytest.approx(float(shares.max()), abs=1e-5)
            assert [token for token, _ in logprob.top[:3]] == [
                allowed[i] for i in shares.argsort(descending=True)
            ]
            assert [value for _, value in logprob.top[3:]] == [FORBIDDEN_LOGPROB, FORBIDDEN_LOGPROB]
        else:  # a free row beside a constrained one keeps the model's logprobs
            assert logprob.logprob == pytest.approx(float(torch.log_softmax(logits[row], -1).max()), abs=1e-5)


EDITS = {
    "logit_bias": {5: 1.0},
    "repetition_penalty": 3.0,  # token 2 is in the prompt: 1.0 / 3 falls below token 5's 0.5
    "presence_penalty": 1.0,  # and in the output: 1.0 - 1.0
    "frequency_penalty": 1.0,
    "allowed_token_ids": [5],
    "banned": None,  # (a SampleRequest field: the step's bans)
    "logprobs": 0,
}


@pytest.mark.parametrize("edit", EDITS)
def test_a_row_that_edits_its_logits_or_wants_logprobs_gets_them_alone_or_among_plain_rows(edit):
    """The sampler skips its passes over the rows' edits (bias, penalties, allowed ids, bans) and
    logprobs when every row is plain (``SampleRequest.plain``, set once): a row with any one of
    them, alone or between plain rows, is still drawn from its edited logits (greedy: token 5, not
    the raw best 2) or gets its logprob (that of the raw logits), and the plain rows are not."""
    logits = torch.zeros(3, 16)
    logits[:, 2], logits[:, 5] = 1.0, 0.5
    fields = {edit: EDITS[edit]} if edit != "banned" else {}
    row = SampleRequest(
        SamplingParams(temperature=0.0, **fields), [2], None, [2], (2,) if edit == "banned" else ()
    )
    plain = SampleRequest(SamplingParams(temperature=0.0), [2], None, [2])
    assert not row.plain and row.greedy and plain.plain
    sampler = Sampler(16, torch.device("cpu"))
    for rows in ([row], [plain, row, plain]):
        result = sampler.sample(logits[: len(rows)].clone(), rows)
        tokens = result.token_ids.tolist()
        drawn = 2 if edit == "logprobs" else 5
        assert tokens == [drawn if r is row else 2 for r in rows]
        logprobs = result.logprobs(tokens)
        for r, logprob in zip(rows, logprobs, strict=True):
            if r is row and edit == "logprobs":
                assert logprob.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[2].item())
            else:
                assert logprob is None


def test_a_request_keeps_its_sample_request_while_its_generator_stays(llm):
    """A request without constraints of its own hands the sampler the same SampleRequest every
    step: it reads the output as it grows, and a new generator (the scheduler gives a seeded
    request its own as it is added) makes a new one, which carries it; through the engine, the one
    a seeded request is sampled with holds the scheduler's generator."""
    from minisgl_core.scheduler.request import Request

    params = SamplingParams(temperature=1.0, seed=7, presence_penalty=1.0, max_tokens=3, ignore_eos=True)
    req = Request(0, [3, 4], params, 0)
    kept = req.sample_request()
    assert kept is req.sample_request() and kept.generator is None
    assert (kept.params, kept.prompt_ids, kept.output_ids) == (params, [3, 4], [])
    assert not kept.plain and not kept.greedy
    req.output_ids.append(9)
    assert req.sample_request() is kept and kept.output_ids == [9]
    req.generator = torch.Generator().manual_seed(7)
    fresh = req.sample_request()
    assert fresh is not kept and fresh.generator is req.generator and fresh.output_ids is req.output_ids

    engine = llm.engine
    engine.add_request(12345, [3, 4, 5], engine.admit([3, 4, 5], params))
    added = engine.scheduler.waiting[12345]
    assert added.generator is not None
    sampled: list[SampleRequest] = []
    sample = engine.sampler.sample

    def recorded(logits, requests, grammar_mask=None):
        sampled.extend(r for r in requests if r.params is params)
        return sample(logits, requests, grammar_mask)

    engine.sampler.sample = recorded
    try:
        while engine.has_work:
            engine.step()
    finally:
        del engine.sampler.sample
    assert len(sampled) == 3 and all(r is sampled[0] for r in sampled)
    assert sampled[0].generator is added.generator and sampled[0].output_ids is added.output_ids

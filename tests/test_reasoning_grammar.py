"""A grammar after the reasoning (``SamplingParams.reasoning_tag_ids``), as vLLM and SGLang
constrain a reasoning model: the output may open with the reasoning's start tag, the reasoning is
free through its end tag, and the grammar applies from the next token.

The tiny model's tokenizer has ``<think>`` and ``</think>`` as single text tokens; its weights are
random, so logit biases steer it where a test needs a tag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from minisgl_core import LLM, SamplingParams
from minisgl_core.api import GrammarSpec, allocate_token_bitmask, allowed_tokens
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.messages import Limits, TokenizeRequest
from minisgl_core.processes.text_workers import Admitter, ends_with_tag
from minisgl_core.scheduler.request import OPENING, REASONING, Request
from minisgl_core.tokenizer.load import load_tokenizer

#: a ChatML template that closes the reasoning in the prompt as Qwen3's does with enable_thinking false
TEMPLATE = Path(__file__).parent / "server" / "data" / "tools_template.jinja"

BACKENDS = ["xgrammar", "llguidance"]
WORD = GrammarSpec("regex", "[a-z]{3,6}")
PROMPT = [10, 20, 30, 40]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "thinker", added_tokens=("<think>", "</think>"), seed=1
    )


@pytest.fixture(scope="module")
def tags(model_dir) -> tuple[int, int]:
    tokenizer = load_tokenizer(model_dir)
    start, end = (tokenizer.encode(t, add_special_tokens=False) for t in ("<think>", "</think>"))
    assert len(start) == len(end) == 1
    return start[0], end[0]


@pytest.fixture(scope="module", params=BACKENDS)
def llm(request, model_dir):
    engine = LLM(model_dir, device="cpu", dtype="float32", attn="torch", grammar_backend=request.param)
    yield engine
    engine.close()


def test_the_output_may_open_with_the_reasoning_and_the_grammar_applies_after_it(llm, tags):
    start, end = tags
    # the start tag well ahead of any other token, the end tag further still: with the tags the
    # output opens with the start tag, the end tag follows at once, then the grammar's text
    bias = {start: 60.0, end: 100.0}
    gated = SamplingParams(
        temperature=0, max_tokens=16, grammar=WORD, logit_bias=bias, reasoning_tag_ids=tags
    )
    out = llm.generate([PROMPT], gated, use_tqdm=False)[0]
    assert out.token_ids[:2] == [start, end], out.token_ids
    assert out.finish_reason == "stop"
    assert re.fullmatch("[a-z]{3,6}", out.text.removeprefix("<think></think>")), out.text
    # without them the grammar applies from the first token: neither tag can be drawn
    plain = SamplingParams(temperature=0, max_tokens=16, grammar=WORD, logit_bias=bias)
    out = llm.generate([PROMPT], plain, use_tqdm=False)[0]
    assert start not in out.token_ids and end not in out.token_ids, out.token_ids
    assert re.fullmatch("[a-z]{3,6}", out.text), out.text


def test_the_reasoning_is_free_and_the_matcher_starts_after_its_end_tag(llm, tags):
    """The runner's masks step by step: the grammar's first tokens and the start tag, then every
    token (the reasoning, the start tag again included), then the grammar from its beginning."""
    start, end = tags
    runner = llm.engine.grammars
    vocab = runner.backend.vocab_size
    backend = runner.backend.get()
    params = SamplingParams(temperature=0, max_tokens=32, grammar=WORD, reasoning_tag_ids=tags)

    def fresh_grammar_row() -> torch.Tensor:
        mask = allocate_token_bitmask(1, vocab)
        backend.matcher(backend.compile(WORD)).fill_bitmask(mask, 0)
        return allowed_tokens(mask[0], vocab)

    def row(req: Request) -> torch.Tensor:
        rows, mask = runner.fill([req])
        assert rows == [0]
        return allowed_tokens(mask[0], vocab)

    first = fresh_grammar_row()
    assert not first[start] and not first[end]
    thinking = torch.ones(vocab, dtype=torch.bool)
    thinking[list(runner.backend.stop_token_ids)] = False
    req = Request(1, PROMPT, params, 0)
    runner.attach(req)
    live = {req.rid: req}
    assert req.reasoning == OPENING
    expected = first.clone()
    expected[start] = True
    assert torch.equal(row(req), expected)
    thought = [start, 50, start, 60, 70]
    for token in thought:
        runner.accept([req], [token], live)
        assert req.reasoning == REASONING
        assert torch.equal(row(req), thinking), "the reasoning is free, but cannot end the output"
    runner.accept([req], [end], live)
    assert req.reasoning is None and req.grammar_tokens == 0
    assert torch.equal(row(req), first), "the grammar starts afresh after the end tag"
    word = llm.tokenizer.encode("abc", add_special_tokens=False)
    for token in word:
        runner.accept([req], [token], live)
    assert req.grammar_tokens == len(word) and req.grammar_error is None
    # a tag inside the grammar's text is the grammar's business: here it is refused
    runner.accept([req], [start], live)
    assert req.grammar_error is not None

    # an output that opens with the grammar's text: no reasoning, the grammar from there on
    other = Request(2, PROMPT, params, 0)
    runner.attach(other)
    runner.accept([other], [word[0]], {other.rid: other})
    assert other.reasoning is None and other.grammar_tokens == 1
    assert not row(other)[start]


def test_sampled_reasoning_then_valid_grammar_text(llm, tags):
    """Sampling with a mild pull towards the tags: every output is (optional reasoning) and then
    the grammar's text, whatever the reasoning held."""
    start, end = tags
    params = [
        SamplingParams(
            temperature=1.0, seed=seed, max_tokens=48, grammar=WORD, logit_bias={start: 4.0, end: 5.0},
            reasoning_tag_ids=tags,
        )
        for seed in range(24)
    ]  # fmt: skip
    outs = llm.generate([PROMPT] * 24, params, use_tqdm=False)
    finished = [o for o in outs if o.finish_reason == "stop"]
    reasoned = [o for o in finished if o.token_ids[0] == start]
    assert len(finished) >= 12, [(o.finish_reason, o.token_ids) for o in outs]
    # some reason before the answer, with some text between the tags; some answer at once
    assert any(o.token_ids.index(end) > 1 for o in reasoned), [o.token_ids for o in reasoned]
    assert 0 < len(reasoned) < len(finished), [o.token_ids for o in finished]
    for out in finished:
        ids = out.token_ids
        after = ids[ids.index(end) + 1 :] if ids[0] == start else ids
        text = llm.tokenizer.decode(after, skip_special_tokens=True)
        assert re.fullmatch("[a-z]{3,6}", text), (ids, text)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    """With the tools template, which closes the reasoning in the prompt as Qwen3's does when
    ``enable_thinking`` is false."""
    return load_tokenizer(model_dir, chat_template=TEMPLATE.read_text())


def test_a_prompt_that_closes_the_reasoning_itself_leaves_no_gate(tokenizer, tags):
    _, end = tags
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert ends_with_tag(tokenizer, encode("<|im_start|>assistant\n<think>\n\n</think>\n\n"), end)
    assert ends_with_tag(tokenizer, encode("x</think>"), end)
    assert not ends_with_tag(tokenizer, encode("<|im_start|>assistant\n"), end)
    # an earlier turn's reasoning, closed long before the answer the prompt asks for
    earlier = "<think>a</think>b<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not ends_with_tag(tokenizer, encode(earlier), end)


def test_the_tokenizer_worker_sets_the_tags_only_where_they_are_single_tokens(tokenizer, tags):
    limits = Limits(max_context_len=512, kv_capacity_tokens=4096, vocab_size=len(tokenizer))
    admitter = Admitter(tokenizer, limits)
    assert admitter.reasoning_tag_ids("<think>", "</think>") == tags
    assert admitter.reasoning_tag_ids("<reason>", "</reason>") is None  # several tokens each

    class Grammars:  # the grammar check itself is other tests' business
        def check(self, spec):
            pass

    admitter.grammars = Grammars()

    def admitted(messages, template_args=None, grammar=WORD, reasoning_tags=("<think>", "</think>")):
        params = SamplingParams(max_tokens=8, grammar=grammar)
        request = TokenizeRequest(
            [1], None, messages, None, params, template_args=template_args,
            reasoning_tags=list(reasoning_tags) if reasoning_tags else None,
        )  # fmt: skip
        return admitter.admit(request)[1].reasoning_tag_ids

    ask = [{"role": "user", "content": "hi"}]
    assert admitted(ask) == tags
    assert admitted(ask, reasoning_tags=None) is None
    assert admitted(ask, reasoning_tags=("<reason>", "</reason>")) is None
    assert admitted(ask, {"enable_thinking": True}) == tags
    # the template closes the reasoning in the prompt: the grammar applies from the first token
    assert admitted(ask, {"enable_thinking": False}) is None
    # the template opens it (the prompt ends "<think>\n"): the output begins inside the reasoning
    opened = TokenizeRequest([1], None, ask, None, SamplingParams(max_tokens=8, grammar=WORD),
                             template_args={"open_thinking": True}, reasoning_tags=["<think>", "</think>"])  # fmt: skip
    ids, sampling = admitter.admit(opened)
    assert sampling.reasoning_tag_ids == tags and sampling.reasoning_opened
    assert admitter.reasoning_opened(opened, ids)
    plain = TokenizeRequest(
        [1], None, ask, None, SamplingParams(max_tokens=8), reasoning_tags=["<think>", "</think>"]
    )
    ids, sampling = admitter.admit(plain)
    assert sampling.reasoning_tag_ids is None and not admitter.reasoning_opened(plain, ids)


def test_a_prompt_that_opened_the_reasoning_starts_the_output_inside_it(llm, tags):
    """``reasoning_opened`` (a prompt ending with the start tag, as Qwen3's thinking-only templates
    and DeepSeek-R1's write): every token is free from the first, the grammar after the end tag."""
    start, end = tags
    runner = llm.engine.grammars
    params = SamplingParams(
        temperature=0, max_tokens=32, grammar=WORD, reasoning_tag_ids=tags, reasoning_opened=True
    )
    req = Request(7, PROMPT, params, 0)
    runner.attach(req)
    assert req.reasoning == REASONING
    rows, mask = runner.fill([req])
    allowed = allowed_tokens(mask[0], runner.backend.vocab_size)
    stops = list(runner.backend.stop_token_ids)
    assert stops and not allowed[stops].any() and int(allowed.sum()) == runner.backend.vocab_size - len(stops)
    # end to end: the end tag first (a bias), then the grammar's answer
    biased = SamplingParams(
        temperature=0, max_tokens=16, grammar=WORD, logit_bias={end: 100.0}, reasoning_tag_ids=tags,
        reasoning_opened=True,
    )  # fmt: skip
    out = llm.generate([PROMPT], biased, use_tqdm=False)[0]
    assert out.token_ids[0] == end and out.finish_reason == "stop", out.token_ids
    assert re.fullmatch("[a-z]{3,6}", llm.tokenizer.decode(out.token_ids[1:], skip_special_tokens=True))


def test_the_reasoning_cannot_end_the_output(llm, tags):
    """While it reasons, a constrained request cannot draw an end-of-text token: the answer comes
    after the end tag (drawn while thinking, it finished a json_schema request "stop" with no
    content). With ignore_eos it is an ordinary token and stays allowed."""
    _, end = tags
    eos = llm.engine.grammars.backend.stop_token_ids[0]
    params = SamplingParams(
        temperature=0, max_tokens=16, grammar=WORD, logit_bias={eos: 100.0, end: 50.0},
        reasoning_tag_ids=tags, reasoning_opened=True,
    )  # fmt: skip
    out = llm.generate([PROMPT], params, use_tqdm=False)[0]
    assert out.token_ids[0] == end and out.finish_reason == "stop", out.token_ids
    assert re.fullmatch("[a-z]{3,6}", llm.tokenizer.decode(out.token_ids[1:], skip_special_tokens=True))
    unstoppable = SamplingParams(
        temperature=0, max_tokens=4, grammar=WORD, logit_bias={eos: 100.0, end: 50.0}, ignore_eos=True,
        reasoning_tag_ids=tags, reasoning_opened=True,
    )  # fmt: skip
    assert llm.generate([PROMPT], unstoppable, use_tqdm=False)[0].token_ids[0] == eos


def test_reasoning_tag_ids_are_checked():
    with pytest.raises(ValueError, match="reasoning_tag_ids only applies with a grammar"):
        SamplingParams(reasoning_tag_ids=(3, 4))
    with pytest.raises(ValueError, match="reasoning_tag_ids must be two different"):
        SamplingParams(grammar=WORD, reasoning_tag_ids=(3, 3))
    with pytest.raises(ValueError, match="reasoning_tag_ids must be two token ids"):
        SamplingParams(grammar=WORD, reasoning_tag_ids=(3,))
    with pytest.raises(ValueError, match="reasoning_tag_ids must be an integer"):
        SamplingParams(grammar=WORD, reasoning_tag_ids=(3, -1))
    with pytest.raises(ValueError, match="reasoning_opened needs reasoning_tag_ids"):
        SamplingParams(grammar=WORD, reasoning_opened=True)
    with pytest.raises(ValueError, match="reasoning_opened must be True or False"):
        SamplingParams(grammar=WORD, reasoning_tag_ids=(3, 4), reasoning_opened=1)
    params = SamplingParams(grammar=WORD, reasoning_tag_ids=[3, 4])
    assert params.reasoning_tag_ids == (3, 4)
    wired = SamplingParams.from_wire([list(v) if isinstance(v, tuple) else v for v in params.to_wire()])
    assert wired.reasoning_tag_ids == (3, 4)

"""The offline API's vLLM parts: ``LLM.chat`` and ``SamplingParams(n=...)`` with
``RequestOutput.outputs``, on the real default model (SmolLM2-135M-Instruct, its GGUF).

One LLM for the module and a few tokens a call: the module's budget is a few seconds of CI.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import pytest

from minisgl_core.llm import LLM, CompletionOutput, RequestOutput
from minisgl_core.sampling import SamplingParams
from minisgl_core.tokenizer.load import apply_chat_template

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def llm(default_model_dir):
    with LLM(default_model_dir, device="cpu", attn="torch", num_kv_tokens=4096) as llm:
        yield llm


def ids_of(llm: LLM, text: str) -> list[int]:
    """``text`` as a chat template's output is tokenized: without the tokenizer's special tokens."""
    return list(llm.tokenizer.encode(text, add_special_tokens=False))


# ---------------------------------------------------------------------------------- chat


def test_chat_renders_as_transformers_and_generates_as_generate(llm, real_references):
    # (not the long input: 480 tokens of prefill, rendered as the other one-message chats)
    refs = [ref for ref in real_references if ref.label != "long-input"]
    chats = llm.chat([ref.messages for ref in refs], GREEDY)
    # transformers' apply_chat_template(..., tokenize=True, add_generation_prompt=True) on the same
    # GGUF, conversation by conversation in order: nothing added in front (no second BOS)
    assert [out.prompt_token_ids for out in chats] == [ref.prompt_ids for ref in refs]
    for ref, out in zip(refs, chats, strict=True):
        assert out.token_ids == ref.output_ids[: len(out.token_ids)], ref.label
    generated = llm.generate([ref.prompt_ids for ref in refs], GREEDY)
    assert [(o.token_ids, o.text, o.finish_reason) for o in chats] == [
        (o.token_ids, o.text, o.finish_reason) for o in generated
    ]
    # one conversation: a list of messages, one output
    [one] = llm.chat(refs[1].messages, SamplingParams(temperature=0.0, max_tokens=1))
    assert one.prompt_token_ids == refs[1].prompt_ids
    assert one.token_ids == chats[1].token_ids[:1]


def test_chat_renders_as_the_server_does(llm):
    one_token = SamplingParams(temperature=0.0, max_tokens=1)
    # OpenAI's "developer" is a system message; content as parts is their text, a line each (an
    # assistant's refusal part is text too), as vLLM and the server join them
    [developer] = llm.chat(
        [
            {
                "role": "developer",
                "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}],
            },
            *HI,
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            *HI,
        ],
        one_token,
    )
    assert developer.prompt_token_ids == apply_chat_template(
        llm.tokenizer,
        [{"role": "system", "content": "Be\nbrief."}, *HI, {"role": "assistant", "content": "No."}, *HI],
    )
    # a template of the caller's, its variables from chat_template_kwargs, with the tools
    [custom] = llm.chat(
        HI,
        one_token,
        chat_template="{{ greeting }}{% for t in tools %}{{ t.function.name }} {% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}",
        chat_template_kwargs={"greeting": "Hello "},
        tools=[WEATHER],
    )
    assert custom.prompt_token_ids == ids_of(llm, "Hello get_weather hi")
    # the reply continues the last (assistant) message: the prompt ends with its text, unclosed
    [cont] = llm.chat(
        [*HI, {"role": "assistant", "content": "Hello! I am"}],
        one_token,
        add_generation_prompt=False,
        continue_final_message=True,
    )
    tail = ids_of(llm, "Hello! I am")
    assert cont.prompt_token_ids[-len(tail) :] == tail


def test_chat_renders_each_conversation_once_into_transformers_ids(llm, monkeypatch):
    """chat rendered each conversation twice (its text for the check by characters, then again to
    tokenize it); once now, its text tokenized as the template's output. The ids stay
    transformers' ``apply_chat_template(tokenize=True)``'s, and truncate_prompt_tokens keeps
    their tail."""
    chats = [HI, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]]
    references = [apply_chat_template(llm.tokenizer, chat) for chat in chats]  # (transformers')
    rendered = []
    apply = llm.tokenizer.apply_chat_template
    monkeypatch.setattr(
        llm.tokenizer, "apply_chat_template", lambda c, *a, **k: rendered.append(c) or apply(c, *a, **k)
    )
    one_token = SamplingParams(temperature=0.0, max_tokens=1)
    outs = llm.chat(chats, one_token)
    assert rendered == chats  # once each, in order
    assert [out.prompt_token_ids for out in outs] == references
    outs = llm.chat(chats, dataclasses.replace(one_token, truncate_prompt_tokens=5))
    assert [out.prompt_token_ids for out in outs] == [ids[-5:] for ids in references]


def test_chat_with_a_model_without_a_chat_template(llm, monkeypatch):
    monkeypatch.setattr(llm.tokenizer, "chat_template", None)
    with pytest.raises(ValueError, match="this model's tokenizer has no chat template: pass chat_template="):
        llm.chat(HI)
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    [out] = llm.chat(HI, SamplingParams(temperature=0.0, max_tokens=1), chat_template=template)
    assert out.prompt_token_ids == ids_of(llm, "<user>hi")


USER = {"role": "user", "content": "hi"}
BAD_MESSAGES = [
    ("hello", TypeError, "messages must be a list of message dicts"),
    ([], ValueError, "messages is empty"),
    ([{"content": "hi"}], ValueError, r'messages\[0\] has no "role"'),
    ([{"role": None, "content": "hi"}], ValueError, r'messages\[0\] has no "role"'),
    ([{"role": 3, "content": "hi"}], TypeError, r"messages\[0\]: role must be a non-empty string"),
    ([{"role": "user"}], ValueError, r"messages\[0\]\.content: a user message needs content"),
    ([{"role": "bogus", "content": "hi"}], ValueError, r"messages\[0\]\.role: unknown role 'bogus'"),
    ([{"role": "tool", "content": "x"}], ValueError, r"messages\[0\]\.tool_call_id: a tool message needs"),
    (["hi"], TypeError, r"messages\[0\] must be a dict with \"role\" and \"content\", got str 'hi'"),
    ([[USER], "hi"], TypeError, r"messages\[1\] must be a list of message dicts, got str"),
    (
        [[USER], [USER, {"role": "user", "content": 5}]],
        TypeError,
        r"messages\[1\]\[1\]: content must be a string",
    ),
    ([[USER], []], ValueError, r"messages\[1\] is empty"),
    (
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        ValueError,
        r"messages\[0\]\.content\[0\]: content parts of type 'image_url' are not supported",
    ),
    ([{"role": "user", "content": "a\udfffb"}], ValueError, "lone UTF-16 surrogate at index 1"),
    (
        [{"role": "user", "content": "hi", "name": "b\udfff"}],
        ValueError,
        r"^messages\[0\]\.name is not valid text: 'b\\udfff' has a lone UTF-16 surrogate at index 1$",
    ),
    # (a RecursionError from repr, naming nothing)
    (
        [{"role": "user", "content": [functools.reduce(lambda inner, _: [inner], range(5000), "x")]}],
        TypeError,
        r"messages\[0\]\.content\[0\] must be a text part .*, got <list nested too deeply to show>$",
    ),
]
BAD_ARGUMENTS = [
    (
        {"chat_template": "{{ raise_exception('roles must alternate') }}"},
        "could not render chat_template: TemplateError: roles must alternate",
    ),
    ({"chat_template": "{{ messages[0].content + 1 }}"}, "could not render chat_template: TypeError"),
    ({"chat_template": "{% for m in messages %}"}, "chat_template does not compile: line 1"),
    ({"chat_template": "templates/chatml.jinja"}, "chat_template must be the Jinja text of a template"),
    ({"tools": [WEATHER]}, "this model's chat template does not render tools"),
    # these were "this model's chat template does not render tools": another template would not help
    (
        {"tools": [WEATHER, {"type": "custom"}]},
        "tools\\[1\\]: type 'custom' is not supported: minisgl calls functions",
    ),
    ({"tools": [{"function": {"name": "f"}}]}, 'tools\\[0\\]: needs "type": "function"'),
    (
        {"tools": [{"type": "function", "function": {"name": ""}}]},
        'tools\\[0\\]: needs "function": .* with a name',
    ),
    ({"continue_final_message": True}, "continue_final_message needs add_generation_prompt turned off"),
    (
        {"continue_final_message": True, "add_generation_prompt": False},
        "continue_final_message needs the last message to be an assistant one, got 'user'",
    ),
    ({"chat_template_kwargs": {"tokenize": False}}, "'tokenize' is not a template variable"),
    ({"chat_template_kwargs": {"tools": []}}, "'tools' is chat\\(\\)'s own argument: pass tools= instead"),
    # a lone surrogate, refused as the server's schema refuses it (it was "could not render chat_template:
    # TypeError: TextEncodeInput must be Union[...]" from the tokenizer, or passed where not rendered)
    (
        {"chat_template_kwargs": {"who": ["a\ud800"]}},
        r"^chat_template_kwargs is not valid text: 'a\\ud800' has a lone UTF-16 surrogate at index 1$",
    ),
    (
        {"tools": [{**WEATHER, "function": {**WEATHER["function"], "description": "\udc00"}}]},
        r"^tools\[0\] is not valid text: '\\udc00' has a lone UTF-16 surrogate at index 0$",
    ),
    (
        {"chat_template": "\ud800{% for m in messages %}{{ m.content }}{% endfor %}"},
        r"^chat_template is not valid text: .* has a lone UTF-16 surrogate at index 0$",
    ),
]


@pytest.mark.parametrize(("messages", "error", "message"), BAD_MESSAGES)
def test_bad_messages_are_named(llm, messages, error, message):
    with pytest.raises(error, match=message):
        llm.chat(messages, GREEDY)
    assert not llm.engine.has_work


@pytest.mark.parametrize(("arguments", "message"), BAD_ARGUMENTS)
def test_bad_template_arguments_are_named(llm, arguments, message):
    with pytest.raises(ValueError, match=message) as caught:
        llm.chat(HI, GREEDY, **arguments)
    assert "jinja2" not in type(caught.value).__module__
    assert not llm.engine.has_work


def test_sampling_params_not_one_per_conversation_are_counted_as_conversations(llm):
    """It said "got 2 prompts but 1 SamplingParams" of chat's two conversations."""
    with pytest.raises(ValueError, match=r"^got 2 conversations but 1 SamplingParams$"):
        llm.chat([HI, HI], [GREEDY])
    with pytest.raises(ValueError, match=r"^got 2 prompts but 1 SamplingParams$"):
        llm.generate(["a", "b"], [GREEDY])


def test_a_failed_chat_leaves_the_llm_usable(llm):
    with pytest.raises(ValueError, match=r"messages\[1\]: could not render chat_template"):
        llm.chat(
            [HI, [{"role": "user", "content": "x"}]],
            GREEDY,
            chat_template="{{ raise_exception('no') if messages[0].content == 'x' else 'ok' }}",
        )
    [out] = llm.chat(HI, SamplingParams(temperature=0.0, max_tokens=1))
    assert out.finish_reason == "length" and len(out.token_ids) == 1


# ---------------------------------------------------------------------------------- n


def test_n_seeded_choices_are_the_servers(llm):
    ids = apply_chat_template(llm.tokenizer, HI)
    seed = 2**63 - 2
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=seed, n=3, logprobs=0)
    # the server runs choice i as a request of its own with seed + i, wrapped into int64: here
    # those three requests run beside the n=3 one
    seeds = [seed, seed + 1, -(2**63)]
    [out, *alone] = llm.generate(
        [ids] * 4, [params, *(dataclasses.replace(params, n=1, seed=s) for s in seeds)]
    )
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert [(c.token_ids, c.text) for c in out.outputs] == [(a.token_ids, a.text) for a in alone]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # three seeds: not one sample thrice
    for choice in out.outputs:
        assert len(choice.logprobs) == len(choice.token_ids)
        assert choice.cumulative_logprob == pytest.approx(sum(entry.logprob for entry in choice.logprobs))


def test_n_greedy_gives_n_equal_completions_in_prompt_order(llm):
    question = [{"role": "user", "content": "What is 12 plus 7?"}]
    three = SamplingParams(temperature=0.0, max_tokens=4, n=3)
    outs = llm.chat([HI, question, HI], [three, three, GREEDY])
    assert [len(o.outputs) for o in outs] == [3, 3, 1]
    assert [o.prompt_token_ids for o in outs] == [
        apply_chat_template(llm.tokenizer, c) for c in (HI, question, HI)
    ]
    single = outs[2]
    assert outs[0].outputs[0].token_ids == single.token_ids  # (its prompt's, not the question's)
    for out in outs[:2]:
        first = out.outputs[0]
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert [(c.token_ids, c.text, c.finish_reason) for c in out.outputs] == [
            (first.token_ids, first.text, first.finish_reason)
        ] * 3
        assert all(c.cumulative_logprob is None and c.logprobs is None for c in out.outputs)
        # the flat fields are the first completion's
        assert (out.text, out.token_ids, out.finish_reason, out.matched_stop, out.logprobs, out.error) == (
            first.text,
            first.token_ids,
            first.finish_reason,
            first.stop_reason,
            first.logprobs,
            first.error,
        )
    assert outs[0].token_ids != outs[1].token_ids
    # n 1: one completion, the flat fields'
    assert single.outputs == [
        CompletionOutput(
            0, single.text, single.token_ids, None, None, single.finish_reason, single.matched_stop
        )
    ]


@pytest.mark.parametrize("n", [0, -1, 65, True, 2.0, "3", None])
def test_n_is_checked_as_the_other_integer_fields(n):
    with pytest.raises(ValueError, match=r"^n must be an integer in \[1, 64\], got"):
        SamplingParams(n=n)


def test_n_never_reaches_an_engine(llm):
    params = SamplingParams(n=64, seed=5, max_tokens=1)
    assert params.n == 64 and llm.sampling_params(n=2).n == 2
    # across processes it stays what the caller asked for
    assert SamplingParams.from_wire(params.to_wire()).n == 64
    assert pickle.loads(pickle.dumps(params)).n == 64
    # each engine request is one choice, the seed of choice i the server's
    assert [(p.n, p.seed) for p in map(params.for_choice, range(3))] == [(1, 5), (1, 6), (1, 7)]
    single = SamplingParams(max_tokens=1)
    assert single.for_choice(0) is single
    # an engine given n != 1 refuses it rather than run one completion of n
    with pytest.raises(ValueError, match="n=2: an engine runs one completion a request"):
        llm.engine.add_request(10**9, [1, 2, 3], SamplingParams(n=2, max_tokens=1))
    assert not llm.engine.has_work


def test_a_request_output_built_by_hand_has_its_outputs():
    out = RequestOutput([1], token_ids=[5], text="x", finish_reason="stop", matched_stop=2)
    assert out.outputs == [CompletionOutput(0, "x", [5], None, None, "stop", 2, None)]


def test_the_output_has_its_prompt_text_as_vllms(llm, default_model_dir):
    """vLLM's quick start prints ``output.prompt`` (an AttributeError here, once): a text prompt
    as given, a conversation as the chat template renders it (transformers' text), None for ids."""
    from transformers import AutoTokenizer

    from minisgl_core.testing.real_model import gguf_file

    text, ids = "The capital of France is", [1, 2, 3]
    outputs = llm.generate([text, ids], GREEDY)
    assert [o.prompt for o in outputs] == [text, None]
    assert outputs[0].prompt_token_ids == list(llm.tokenizer.encode(text))
    path = gguf_file(default_model_dir)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    conversations = [HI, [{"role": "system", "content": "Be brief."}, *HI]]
    chats = llm.chat(conversations, GREEDY)
    rendered = [
        reference.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations
    ]
    assert [o.prompt for o in chats] == rendered
    assert [o.prompt_token_ids for o in chats] == [ids_of(llm, r) for r in rendered]
    [continued] = llm.chat(
        [*HI, {"role": "assistant", "content": "Hel"}], GREEDY,
        add_generation_prompt=False, continue_final_message=True,
    )  # fmt: skip
    assert continued.prompt.endswith("Hel") and ids_of(llm, continued.prompt) == continued.prompt_token_ids


def test_vllms_prompt_dicts_are_the_text_or_the_ids(llm):
    """vLLM's TextPrompt and TokensPrompt (its one way to pass token ids now) were a TypeError."""
    text, ids = "The capital of France is", [1, 504, 3575]
    plain = llm.generate([text, ids], GREEDY)
    dicts = llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], GREEDY)
    assert [(o.prompt, o.prompt_token_ids, o.token_ids, o.text) for o in dicts] == [
        (o.prompt, o.prompt_token_ids, o.token_ids, o.text) for o in plain
    ]
    [one] = llm.generate({"prompt_token_ids": ids}, GREEDY)
    assert one.token_ids == plain[1].token_ids
    for prompt, says in [
        ({"prompt": text, "multi_modal_data": {}}, r"'multi_modal_data' is not supported"),
        ({"prompt": text, "prompt_token_ids": ids}, "got both"),
        ({"prompt": ids}, "'prompt' must be a str, got list"),
        ({"prompt_token_ids": text}, "'prompt_token_ids' must be a list of token ids, got str"),
    ]:
        with pytest.raises(TypeError, match=r"^prompts\[1\]: a prompt dict.*" + says):
            llm.generate([text, prompt], GREEDY)
    with pytest.raises(ValueError, match=r"prompt token ids must be integers in \[0, "):
        llm.generate({"prompt_token_ids": [10**9]}, GREEDY)


# ------------------------------------------------------------------------------ use_tqdm


@pytest.mark.parametrize("use_tqdm", ["yes", 1, 0, "False"])
def test_use_tqdm_takes_a_bool_none_or_a_callable_and_refuses_the_rest(llm, use_tqdm):
    """use_tqdm="yes" (or 0, "False") showed a bar as a true value, or none as a false one;
    it is refused as the API's other flags are (chat's add_generation_prompt...)."""
    says = r"^use_tqdm must be True, False, None \(a bar from 16 completions on\) or a callable"
    with pytest.raises(TypeError, match=says) as err:
        llm.generate("hi", GREEDY, use_tqdm=use_tqdm)
    assert str(err.value).endswith(f"got {use_tqdm!r}")
    with pytest.raises(TypeError, match=says):
        llm.chat(HI, GREEDY, use_tqdm=use_tqdm)


def test_use_tqdm_may_be_a_callable_that_makes_the_bar_as_vllms(llm):
    made = []

    class Bar:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.n = 0

        def update(self, n):
            self.n += n

        def close(self):
            pass

    outputs = llm.generate(["hi", "hello"], GREEDY, use_tqdm=Bar)
    assert [o.finish_reason for o in outputs] == ["length", "length"]
    assert made == [{"total": 2, "desc": "generate", "unit": "req"}]
    assert llm.generate("hi", GREEDY, use_tqdm=False)[0].token_ids == outputs[0].token_ids

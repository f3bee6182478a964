"""The wire format between the server's processes, and the detokenizer worker's bookkeeping."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from minisgl_core import messages as m
from minisgl_core.processes.text_workers import Admitter, Detokenizer, RequestRejected
from minisgl_core.sampling import SamplingParams
from minisgl_core.tokenizer.detokenize import final_text
from minisgl_core.tokenizer.load import load_tokenizer

SAMPLES = [
    m.Limits(2048, 65536, 1024),
    m.TokenizeRequest(
        [3, 4], None, [{"role": "user", "content": "hé"}], None, {"max_tokens": None}, "max_tokens"
    ),
    m.Admission(3, 17, 100, error="too long", param="messages"),
    m.EngineRequest(5, [1, 2, 3], {"temperature": 0.0, "stop": ["x"], "seed": None}),
    m.AbortRequest(5),
    m.Shutdown(),
    m.DetokRegister(5, ["\n\n"], True),
    m.StepOutputs(
        [5, 6],
        [10, -1],
        [None, "abort"],
        [None, None],
        [[10, -0.5, [[10, -0.5]]], None],
        [None, None],
        {"running": 1},
    ),
    m.DetokOutputs([5], [10], ["hi"], ["stop"], ["</s>"], [None], [None], None),
    m.ProcessReady("scheduler", 1, {"max_context_len": 2048}),
    m.ProcessFailed("tokenizer", 0, "Traceback ...\nValueError: x"),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=[type(s).__name__ for s in SAMPLES])
def test_every_message_round_trips(msg):
    data = m.encode(msg)
    assert isinstance(data, bytes)
    assert m.decode(data) == msg
    # plain msgpack, no pickle: any msgpack reader sees a tag and the fields
    tag, *fields = msgpack.unpackb(data)
    assert tag == msg.tag and len(fields) == len(dataclasses.fields(msg))


def test_unknown_tag_is_an_error():
    with pytest.raises(ValueError, match="unknown message tag"):
        m.decode(msgpack.packb([999]))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


def test_detokenizer_holds_outputs_that_overtake_their_registration(tokenizer):
    ids = tokenizer.encode("hello wide world", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    early = m.StepOutputs()
    early.add(7, ids[0], None)
    assert detok.convert(early).rids == []  # not registered yet: kept back
    first = detok.register(m.DetokRegister(7, [], True))
    assert first is not None and first.rids == [7]
    text = first.texts[0]
    for i, token in enumerate(ids[1:], 1):
        step = m.StepOutputs()
        step.add(7, token, "length" if i == len(ids) - 1 else None)
        text += detok.convert(step).texts[0]
    assert text == final_text(tokenizer, ids, None)
    assert detok.streams == {}  # forgotten once finished


def test_detokenizer_adds_token_text_to_logprobs(tokenizer):
    ids = tokenizer.encode("sea", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    detok.register(m.DetokRegister(1, [], True))
    step = m.StepOutputs()
    step.add(1, ids[0], "length", logprob=[ids[0], -0.25, [[ids[0], -0.25], [5, -3.0]]])
    out = detok.convert(step)
    token_text = tokenizer.decode([ids[0]])
    assert out.logprobs[0] == [
        token_text,
        -0.25,
        [[token_text, -0.25, ids[0]], [tokenizer.decode([5]), -3.0, 5]],
        ids[0],
    ]


def test_admitter_fills_max_tokens_and_names_the_bad_field(tokenizer):
    admitter = Admitter(tokenizer, m.Limits(max_context_len=64, kv_capacity_tokens=48, vocab_size=1024))

    def admit(params, text="hello", field="max_tokens"):
        return admitter.admit(m.TokenizeRequest([0], text, None, None, params, field))

    ids, sampling = admit({"max_tokens": None})
    assert isinstance(sampling, SamplingParams) and sampling.max_tokens == 48 - len(ids)  # the smaller limit
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": 60}, field="max_completion_tokens")
    assert bad.value.param == "max_completion_tokens"
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": None}, text="word " * 100)
    assert bad.value.param == "prompt" and "no room" in str(bad.value)
    with pytest.raises(RequestRejected) as bad:
        admit({"max_tokens": 4, "top_p": 0})
    assert bad.value.param == "top_p"

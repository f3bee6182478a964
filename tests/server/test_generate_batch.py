"""SGLang's batch on /generate: ``text`` a list of texts or ``input_ids`` a list of token id lists,
with ``sampling_params``, ``rid``, ``return_logprob``, ``top_logprobs_num`` and
``logprob_start_len`` one for all or a list of one per prompt, and ``sampling_params.n`` samples
of each prompt. The answer is a list in prompt order (a prompt's samples together); a stream's
chunks say their place in it as ``index``. Each answer must equal what the prompt gets alone."""

from __future__ import annotations

import json

import httpx
import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
TEXTS = ["The cat sat on", "Once upon a time", "Paris is"]


def generate(server, auth, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}/generate", json=body, headers={**auth, **(headers or {})}, timeout=120)


def alone(server, auth, **body) -> dict:
    resp = generate(server, auth, body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def streamed(server, auth, body: dict) -> list[dict]:
    with httpx.stream(
        "POST", f"{server.url}/generate", json={**body, "stream": True}, headers=auth, timeout=120
    ) as resp:
        assert resp.status_code == 200, resp.read()
        lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_a_batch_of_texts_answers_each_prompt_as_alone_in_order(server, auth):
    resp = generate(server, auth, {"text": TEXTS, "sampling_params": GREEDY})
    assert resp.status_code == 200, resp.text
    answers = resp.json()
    assert isinstance(answers, list) and len(answers) == len(TEXTS)
    for text, answer in zip(TEXTS, answers):
        single = alone(server, auth, text=text, sampling_params=GREEDY)
        assert (answer["text"], answer["output_ids"]) == (single["text"], single["output_ids"])
        assert answer["meta_info"]["prompt_tokens"] == single["meta_info"]["prompt_tokens"]
        assert answer["meta_info"]["completion_tokens"] == 6
    ids = [a["meta_info"]["id"] for a in answers]
    assert len(set(ids)) == len(ids)
    # the ids are the request's own with each answer's index after it, and the header says it
    base = resp.headers["x-request-id"]
    assert ids == [f"{base}-{i}" for i in range(len(TEXTS))]


def test_a_batch_of_token_ids_with_sampling_params_of_its_own_each(server, auth):
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    params = [{**GREEDY, "max_new_tokens": k} for k in (2, 5, 3)]
    answers = alone(server, auth, input_ids=prompts, sampling_params=params)
    assert [a["meta_info"]["completion_tokens"] for a in answers] == [2, 5, 3]
    for ids, p, answer in zip(prompts, params, answers):
        assert answer["output_ids"] == alone(server, auth, input_ids=ids, sampling_params=p)["output_ids"]
        assert answer["meta_info"]["prompt_tokens"] == len(ids)


def test_n_samples_of_one_prompt_come_back_as_a_list(server, auth):
    answers = alone(server, auth, text="Hello there", sampling_params={**GREEDY, "n": 3})
    single = alone(server, auth, text="Hello there", sampling_params=GREEDY)
    assert len(answers) == 3 and all(a["output_ids"] == single["output_ids"] for a in answers)
    # sampled: three draws, each as long as asked
    drawn = alone(
        server,
        auth,
        text="Hello there",
        sampling_params={"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "n": 3, "seed": 3},
    )
    assert [a["meta_info"]["completion_tokens"] for a in drawn] == [8, 8, 8]
    # a batch with n: prompt-major order
    both = alone(server, auth, text=TEXTS[:2], sampling_params={**GREEDY, "n": 2})
    firsts = [alone(server, auth, text=t, sampling_params=GREEDY)["output_ids"] for t in TEXTS[:2]]
    assert [a["output_ids"] for a in both] == [firsts[0], firsts[0], firsts[1], firsts[1]]


def test_a_streamed_batch_says_each_chunks_index_and_ends_as_the_whole_answer(server, auth):
    body = {"text": TEXTS, "sampling_params": [{**GREEDY, "max_new_tokens": k} for k in (3, 6, 4)]}
    whole = alone(server, auth, **body)
    chunks = streamed(server, auth, body)
    assert {c["index"] for c in chunks} == {0, 1, 2}
    last = {c["index"]: c for c in chunks}  # each answer's chunks carry its text so far
    for i, answer in enumerate(whole):
        assert last[i]["text"] == answer["text"] and last[i]["output_ids"] == answer["output_ids"]
        assert last[i]["meta_info"]["finish_reason"] == answer["meta_info"]["finish_reason"]
    # one prompt, one sample: chunks as before, without an index
    one = streamed(server, auth, {"text": TEXTS[0], "sampling_params": GREEDY})
    assert one and all("index" not in c for c in one)


def test_rids_name_a_batchs_answers_and_the_header_wins(server, auth):
    body = {"text": TEXTS[:2], "sampling_params": GREEDY, "rid": ["a", "b"]}
    assert [a["meta_info"]["id"] for a in alone(server, auth, **body)] == ["a", "b"]
    with_n = alone(server, auth, **{**body, "sampling_params": {**GREEDY, "n": 2}})
    assert [a["meta_info"]["id"] for a in with_n] == ["a-0", "a-1", "b-0", "b-1"]
    resp = generate(server, auth, body, {"X-Request-Id": "hdr"})
    assert resp.headers["x-request-id"] == "hdr"
    assert [a["meta_info"]["id"] for a in resp.json()] == ["hdr-0", "hdr-1"]


def test_logprob_fields_per_prompt(server, auth):
    answers = alone(
        server,
        auth,
        text=TEXTS[:2],
        sampling_params=GREEDY,
        return_logprob=[True, False],
        top_logprobs_num=[2, 0],
        logprob_start_len=[0, -1],
    )
    first, second = (a["meta_info"] for a in answers)
    assert len(first["output_token_logprobs"]) == 6 and all(len(t) == 2 for t in first["output_top_logprobs"])
    # every prompt token from 0 on, the first one's logprob null (SGLang's)
    prompt = first["input_token_logprobs"]
    assert len(prompt) == first["prompt_tokens"] and prompt[0][0] is None
    assert "output_token_logprobs" not in second and "input_token_logprobs" not in second
    single = alone(
        server,
        auth,
        text=TEXTS[0],
        sampling_params=GREEDY,
        return_logprob=True,
        top_logprobs_num=2,
        logprob_start_len=0,
    )["meta_info"]
    for key in ("output_token_logprobs", "input_token_logprobs"):
        assert [t[1] for t in first[key]] == [t[1] for t in single[key]]
        start = 1 if key == "input_token_logprobs" else 0  # (the first prompt token's: null)
        assert [t[0] for t in first[key][start:]] == pytest.approx(
            [t[0] for t in single[key][start:]], abs=1e-4
        )


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"text": []}, "text", "text: an empty batch"),
        (
            {"text": ["Hi", "Bye"], "rid": ["a", "b" * 257]},
            "rid.1",
            "rid.1: String should have at most 256 characters",
        ),
        (
            {"input_ids": [[5], [6]], "sampling_params": [GREEDY]},
            "sampling_params",
            "sampling_params: 1 value(s) for a batch of 2 prompt(s)",
        ),
        ({"text": "Hi", "sampling_params": [GREEDY]}, "sampling_params", "a list goes with a batch"),
        ({"text": "Hi", "rid": ["a"]}, "rid", "a list goes with a batch"),
        ({"text": ["Hi", "Bye"], "rid": "a"}, "rid", "X-Request-Id"),
        ({"text": ["Hi", "Bye"], "return_logprob": [True]}, "return_logprob", "one per prompt"),
        (
            {"text": ["Hi", "Bye"], "sampling_params": [GREEDY, {"temperature": -1}]},
            "sampling_params.1.temperature",
            "",
        ),
        ({"input_ids": [[5], [10**9]]}, "input_ids.1", "token ids"),
        ({"text": ["Hi", "Bye"], "sampling_params": {"n": 0}}, "sampling_params.n", ""),
        ({"text": ["Hi", "Bye"], "rid": ["a", ""]}, "rid.1", ""),
    ],
)
def test_bad_batches_are_a_400_naming_the_field(server, auth, body, param, words):
    resp = generate(server, auth, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert not error["message"].startswith(f"{param}: {param}"), error  # (named once)


def test_a_prompt_refused_after_others_were_admitted_withdraws_them(server, auth, read_metrics):
    """The second prompt's logprob_start_len is past it, known once it is tokenized, after the
    first prompt's admission: the refusal withdraws the first (counted as one rejection, not an
    abort, with no prompt tokens served)."""
    before = read_metrics()
    resp = generate(
        server,
        auth,
        {
            "text": ["A long first prompt to admit", "Hi"],
            "sampling_params": {**GREEDY, "max_new_tokens": 200},
            "return_logprob": True,
            "logprob_start_len": [0, 50],
        },
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "logprob_start_len.1"
    after = read_metrics()
    for name, grew in [
        ("minisgl_requests_rejected_total", 1),
        ('minisgl_requests_total{finish_reason="abort"}', 0),
        ("minisgl_prompt_tokens_total", 0),
    ]:
        assert after[name] - before[name] == grew, name

"""Bad input gets an OpenAI-style 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]
LONG = "word " * 2500  # well over the 2048-token context

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

CASES = [
    # (path, body or raw text, status, param the error names, words the message contains)
    (CHAT, '{"messages": [', 400, None, "malformed JSON"),
    (CHAT, "[1, 2]", 400, None, ""),
    (CHAT, {"messages": []}, 400, "messages", ""),
    (CHAT, {}, 400, "messages", ""),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", "unknown role"),
    (CHAT, {"messages": [{"role": "user", "content": LONG}]}, 400, "messages", "context length"),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens", "max_tokens"),
    (CHAT, {"messages": USER, "max_completion_tokens": -3}, 400, "max_completion_tokens", ""),
    (CHAT, {"messages": USER, "max_tokens": 100000}, 400, "max_tokens", "context length"),
    (CHAT, {"messages": USER, "temperature": -1}, 400, "temperature", "temperature"),
    (CHAT, {"messages": USER, "top_p": 1.5}, 400, "top_p", ""),
    (CHAT, {"messages": USER, "top_k": -7}, 400, "top_k", ""),
    (CHAT, {"messages": USER, "min_p": 2}, 400, "min_p", ""),
    (CHAT, {"messages": USER, "presence_penalty": 3}, 400, "presence_penalty", ""),
    (CHAT, {"messages": USER, "frequency_penalty": -2.5}, 400, "frequency_penalty", ""),
    (CHAT, {"messages": USER, "n": 0}, 400, "n", ""),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs", ""),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", "requires logprobs"),
    (CHAT, {"messages": USER, "tools": [{"type": "function"}]}, 400, "tools.0.function", ""),
    (CHAT, {"messages": USER, "tool_choice": "required"}, 400, "tool_choice", "needs tools"),
    (CHAT, {"messages": USER, "tool_choice": "sometimes"}, 400, "tool_choice", ""),
    (CHAT, {"messages": USER, "logit_bias": {"5": 101}}, 400, "logit_bias", "[-100, 100]"),
    (CHAT, {"messages": USER, "logit_bias": {"999999": 1}}, 400, "logit_bias", "logit_bias"),
    (CHAT, {"messages": USER, "logit_bias": {"five": 1}}, 400, "logit_bias", "token ids"),
    # one token under two spellings: the last bias silently won
    (
        CHAT,
        {"messages": USER, "logit_bias": {"17": 100, "017": -100}},
        400,
        "logit_bias",
        "names token 17 twice",
    ),
    (CHAT, {"messages": USER, "logit_bias": {"99999999999999999999": 1}}, 400, "logit_bias", "token ids"),
    (CHAT, {"messages": USER, "repetition_penalty": 0}, 400, "repetition_penalty", "> 0"),
    (CHAT, {"messages": [{"role": "tool", "content": "18 C"}]}, 400, "messages.0", "tool_call_id"),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nope"}},
            },
        },
        400,
        "response_format",
        "json_schema",
    ),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, 400, "response_format.type", ""),
    (
        CHAT,
        {"messages": USER, "response_format": {"type": "json_schema"}},
        400,
        "response_format",
        "required",
    ),
    (CHAT, {"messages": USER, "regex": "a", "ebnf": 'root ::= "a"'}, 400, "ebnf", "at most one"),
    (
        COMPLETIONS,
        {"prompt": "hi", "structured_outputs": {"regex": "(unclosed"}},
        400,
        "structured_outputs",
        "regex",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "structured_outputs": {"regex": "a", "choice": ["b"]}},
        400,
        "structured_outputs",
        "exactly one",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "structured_outputs": {"whitespace_pattern": " "}},
        400,
        "structured_outputs.whitespace_pattern",
        "unsupported",
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"json_schema": "{bad"}},
        400,
        "sampling_params.json_schema",
        "not valid JSON",
    ),
    (CHAT, {"messages": USER, "model": "gpt-4"}, 404, "model", "does not exist"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt", ""),
    (COMPLETIONS, {"prompt": "hi", "suffix": "end"}, 400, "suffix", "suffix is not supported"),
    # whole-body checks name the field they blame (param was null)
    (
        CHAT,
        {"messages": USER, "max_tokens": 3, "max_completion_tokens": 4},
        400,
        "max_completion_tokens",
        "not two different values",
    ),
    (
        CHAT,
        {"messages": USER, "continue_final_message": True},
        400,
        "add_generation_prompt",
        "needs add_generation_prompt turned off",
    ),
    (COMPLETIONS, {"prompt": [5, 99999]}, 400, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": LONG}, 400, "prompt", "context length"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 21}, 400, "logprobs", ""),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"max_new_tokens": -1}},  # (0 scores the prompt)
        400,
        "sampling_params.max_new_tokens",
        "",
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"beam_width": 4}},
        400,
        "sampling_params.beam_width",
        "",
    ),
    ("/generate", {"sampling_params": {}}, 400, None, "exactly one"),
    # integers past 64 bits, or out of a field's range (issue 15 item 2)
    (COMPLETIONS, {"prompt": "hi", "top_k": 2**63}, 400, "top_k", "integer in"),
    (COMPLETIONS, {"prompt": "hi", "top_k": 2**64}, 400, "top_k", "integer in"),
    (CHAT, {"messages": USER, "seed": 2**64}, 400, "seed", "integer in"),
    (CHAT, {"messages": USER, "seed": -(2**63) - 1}, 400, "seed", "integer in"),
    (CHAT, {"messages": USER, "max_tokens": 2**64}, 400, "max_tokens", "integer in"),
    (CHAT, {"messages": USER, "max_completion_tokens": -(2**64)}, 400, "max_completion_tokens", ""),
    (CHAT, {"messages": USER, "stop_token_ids": [2**64]}, 400, "stop_token_ids", ""),
    (CHAT, {"messages": USER, "stop_token_ids": [99999]}, 400, "stop_token_ids", "token ids"),
    (CHAT, {"messages": USER, "n": 2**64}, 400, "n", ""),
    # vLLM's allowed_token_ids and bad_words
    (CHAT, {"messages": USER, "allowed_token_ids": []}, 400, "allowed_token_ids", "at least one token id"),
    (CHAT, {"messages": USER, "allowed_token_ids": [5, 99999]}, 400, "allowed_token_ids", "vocabulary"),
    (COMPLETIONS, {"prompt": "hi", "allowed_token_ids": [5, -1]}, 400, "allowed_token_ids", "integer in"),
    (COMPLETIONS, {"prompt": "hi", "allowed_token_ids": 5}, 400, "allowed_token_ids", ""),
    (COMPLETIONS, {"prompt": "hi", "allowed_token_ids": ["5"]}, 400, "allowed_token_ids.0", "not a string"),
    (CHAT, {"messages": USER, "bad_words": "hi"}, 400, "bad_words", ""),
    (CHAT, {"messages": USER, "bad_words": [7]}, 400, "bad_words.0", ""),
    (CHAT, {"messages": USER, "bad_words": ["ok", " "]}, 400, "bad_words", "besides whitespace"),
    (COMPLETIONS, {"prompt": "hi", "bad_words": ["w"] * 129}, 400, "bad_words", "at most 128"),
    # (constraints that leave no token: the sampler drew an arbitrary one, output with a 200; then
    # a stream started and ended with an error event; now admission refuses it)
    (
        COMPLETIONS,
        {"prompt": "hi", "allowed_token_ids": [5], "stop_token_ids": [5], "min_tokens": 2, "stream": True},
        400,
        "allowed_token_ids",
        "no token is left to sample after 0 output token(s): allowed_token_ids and min_tokens rule out",
    ),
    # vLLM's older guided_* (and a start-up choice sent per request): the 400 says what to send
    (
        CHAT,
        {"messages": USER, "guided_json": {"type": "object"}},
        400,
        "guided_json",
        'structured_outputs {"json"',
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "guided_choice": ["a"]},
        400,
        "guided_choice",
        'structured_outputs {"choice"',
    ),
    (
        CHAT,
        {"messages": USER, "guided_decoding_backend": "xgrammar"},
        400,
        "guided_decoding_backend",
        "--grammar-backend",
    ),
    (COMPLETIONS, {"prompt": "hi", "max_new_tokens": 4}, 400, "max_new_tokens", "send max_tokens"),
    # (SGLang's /generate has no such fields: refused as any unknown one, not ignored)
    (
        "/generate",
        {"text": "hi", "sampling_params": {"bad_words": ["x"]}},
        400,
        "sampling_params.bad_words",
        "",
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"allowed_token_ids": [5]}},
        400,
        "sampling_params.allowed_token_ids",
        "",
    ),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 2**64}, 400, "top_logprobs", ""),
    (COMPLETIONS, {"prompt": [5, 2**64]}, 400, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": [[5], [-(2**64)]]}, 400, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": [5, -1]}, 400, "prompt", "token ids"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 2**64}, 400, "logprobs", ""),
    ("/generate", {"input_ids": [2**64]}, 400, "input_ids", "token ids"),
    ("/generate", {"text": "hi", "sampling_params": {"seed": 2**64}}, 400, "sampling_params.seed", ""),
    ("/generate", {"text": "hi", "sampling_params": {"top_k": 2**63}}, 400, "sampling_params.top_k", ""),
    (
        "/generate",
        {"text": "hi", "return_logprob": True, "top_logprobs_num": 2**64},
        400,
        "top_logprobs_num",
        "",
    ),
    # lone UTF-16 surrogates (issue 15 item 3), sent as raw JSON escapes
    (COMPLETIONS, r'{"prompt": "a\udfffb"}', 400, "prompt", "surrogate"),
    (COMPLETIONS, r'{"prompt": ["ok", "\ud800"]}', 400, "prompt.1", "surrogate"),
    (COMPLETIONS, r'{"prompt": "hi", "stop": "\udfff"}', 400, "stop", "surrogate"),
    (COMPLETIONS, r'{"prompt": "hi", "stop": ["x", "\udfff"]}', 400, "stop.1", "surrogate"),
    (CHAT, r'{"messages": [{"role": "user", "content": "\udfff"}]}', 400, "messages.0.content", "surrogate"),
    (
        CHAT,
        r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]}',
        400,
        "messages.0.content.0.text",
        "surrogate",
    ),
    (CHAT, r'{"messages": [{"role": "user", "content": "hi"}], "user": "\udfff"}', 400, "user", "surrogate"),
    (COMPLETIONS, {"prompt": "hi", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens", "-1"),
    # continuous_usage_stats alone implies include_usage (vLLM's default); turned off it contradicts
    (
        COMPLETIONS,
        {
            "prompt": "hi",
            "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True},
        },
        400,
        "stream_options",
        "include_usage true (or left out)",
    ),
    (
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 2, "min_tokens": 3},
        400,
        "min_tokens",
        "at most max_tokens",
    ),
    (COMPLETIONS, {"prompt": "hi", "min_tokens": -1}, 400, "min_tokens", ""),
    # max_tokens unset on chat: what the context leaves (the demo model's 2,048 less the prompt) caps it
    (
        CHAT,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": None, "min_tokens": 2**63 - 1},
        400,
        "min_tokens",
        "lower min_tokens",
    ),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": 5}]}]}, 400, "messages.0.content", "type 5"),
    (COMPLETIONS, {"prompt": "hi", "min_tokens": 2, "regex": "a+"}, 400, "min_tokens", "grammar"),
    (COMPLETIONS, {"prompt": "hi", "truncate_prompt_tokens": -2}, 400, "truncate_prompt_tokens", "-1"),
    # a part the server cannot take says so (it read "text: Field required")
    (
        CHAT,
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}
            ]
        },
        400,
        "messages.0.content",
        "'image_url' are not supported",
    ),
    ("/generate", r'{"text": "\udfff"}', 400, "text", "surrogate"),
    # stream fields name themselves (issue 15 item 8)
    (CHAT, {"messages": USER, "stream_options": {"include_usage": True}}, 400, "stream_options", "stream"),
    (CHAT, {"messages": USER, "stream": "sometimes"}, 400, "stream", ""),
    (
        COMPLETIONS,
        {"prompt": "hi", "stream": True, "stream_options": {"include_usage": 3}},
        400,
        "stream_options.include_usage",
        "",
    ),
    # JSON types are strict (pydantic's lax mode read true as 1 and "true" as true; OpenAI refuses)
    (COMPLETIONS, {"prompt": [True, 5]}, 400, "prompt.0", "integer, not a boolean"),
    (COMPLETIONS, {"prompt": [[5], [5, False]]}, 400, "prompt.1.1", "integer, not a boolean"),
    (COMPLETIONS, {"prompt": "hi", "top_k": True}, 400, "top_k", "integer, not a boolean"),
    (COMPLETIONS, {"prompt": "hi", "echo": "true"}, 400, "echo", "boolean, not a string"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": True}, 400, "logprobs", "integer, not a boolean"),
    (CHAT, {"messages": USER, "max_tokens": True}, 400, "max_tokens", "integer, not a boolean"),
    (CHAT, {"messages": USER, "max_tokens": "5"}, 400, "max_tokens", "integer, not a string"),
    (CHAT, {"messages": USER, "max_tokens": 2.5}, 400, "max_tokens", "not a number with a fraction"),
    (CHAT, {"messages": USER, "seed": True}, 400, "seed", "integer, not a boolean"),
    (CHAT, {"messages": USER, "n": True}, 400, "n", "integer, not a boolean"),
    (CHAT, {"messages": USER, "stop_token_ids": [True]}, 400, "stop_token_ids.0", "not a boolean"),
    (CHAT, {"messages": USER, "temperature": True}, 400, "temperature", "number, not a boolean"),
    (CHAT, {"messages": USER, "top_p": "0.5"}, 400, "top_p", "number, not a string"),
    (COMPLETIONS, r'{"prompt": "hi", "top_p": 1%s}' % ("0" * 400), 400, "top_p", "integer this large"),
    (CHAT, {"messages": USER, "logit_bias": {"5": True}}, 400, "logit_bias.5", "not a boolean"),
    (CHAT, {"messages": USER, "stream": 1}, 400, "stream", "boolean, not an integer"),
    (CHAT, {"messages": USER, "logprobs": "yes"}, 400, "logprobs", "boolean, not a string"),
    (CHAT, {"messages": USER, "ignore_eos": 0}, 400, "ignore_eos", "boolean, not an integer"),
    ("/generate", {"input_ids": [1, True]}, 400, "input_ids.1", "integer, not a boolean"),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"max_new_tokens": True}},
        400,
        "sampling_params.max_new_tokens",
        "not a boolean",
    ),
    ("/generate", {"text": "hi", "return_logprob": 1}, 400, "return_logprob", "not an integer"),
    ("/detokenize", {"tokens": [True]}, 400, "tokens.0", "integer, not a boolean"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": "false"}, 400, "add_special_tokens", ""),
    # /tokenize takes the chat route's template variables only: return_tensors was a 500 (a tensor
    # it could not serialize), a client's own chat_template ran any Jinja loop, truncation changed
    # the count
    (
        "/tokenize",
        {"messages": USER, "chat_template_kwargs": {"return_tensors": "pt"}},
        400,
        "chat_template_kwargs",
        "set by the server",
    ),
    (
        "/tokenize",
        {"messages": USER, "chat_template_kwargs": {"chat_template": "{{ 1 }}"}},
        400,
        "chat_template_kwargs",
        "set by the server",
    ),
    (
        "/tokenize",
        {"messages": USER, "chat_template_kwargs": {"truncation": True, "max_length": 2}},
        400,
        "chat_template_kwargs",
        "set by the server",
    ),
    (
        "/tokenize",
        {"messages": USER, "chat_template_kwargs": {"tools": []}},
        400,
        "chat_template_kwargs",
        "set the request's tools field",
    ),
    ("/tokenize", {"prompt": "hi", "model": "nope"}, 404, "model", "does not exist"),
    ("/detokenize", {"tokens": [1], "model": "nope"}, 404, "model", "does not exist"),
    # (the tokenizer's own complaint before: "TextEncodeInput must be Union[...]")
    ("/tokenize", '{"prompt": "a\\ud800"}', 400, "prompt", "lone UTF-16 surrogate"),
    (COMPLETIONS, '{"prompt": "hi", "timeout": NaN}', 400, "timeout", "finite number"),
    # (1,000 stops of 8,000 characters stalled every request of the server for a minute)
    (COMPLETIONS, {"prompt": "hi", "stop": ["s"] * 257}, 400, "stop", "at most 256 strings"),
    # a list is shown as the client sent it (JSON), not as the Python tuple kept of it: ('',)
    (COMPLETIONS, {"prompt": "hi", "stop": ["x", ""]}, 400, "stop", 'non-empty strings, got ["x", ""]'),
    (CHAT, {"messages": USER, "stop": ""}, 400, "stop", 'got [""]'),
    (CHAT, {"messages": USER, "stop": ["é" * 30, ""] * 3}, 400, "stop", '"", ...'),  # cut short
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [3, -1]}, 400, "stop_token_ids", "got [3, -1]"),
    (
        CHAT,
        {"messages": [*USER, {"role": "assistant"}]},
        400,
        "messages.1",
        "an assistant message needs content",
    ),
    # a refusal part is an assistant's (OpenAI's schema); in another message it says where it belongs
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]},
        400,
        "messages.0.content",
        "'refusal' belong to assistant messages",
    ),
    (CHAT, {"messages": USER, "stop": ["ok", "s" * 1025]}, 400, "stop", "at most 1024 characters"),
    # (a regex of 2 MB took 55 s to compile, on after its client had left)
    (COMPLETIONS, {"prompt": "hi", "regex": "a" * 600_000}, 400, "regex", "at most 524,288 are taken"),
    (
        CHAT,
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "big", "schema": {"enum": ["v" * 1000] * 600}},
            },
        },
        400,
        "response_format",
        "at most 524,288 are taken",
    ),
    (
        "/generate",
        {"text": "hi", "sampling_params": {"ebnf": 'root ::= "' + "a" * 600_000 + '"'}},
        400,
        "sampling_params.ebnf",
        "at most 524,288 are taken",
    ),
]


def test_a_body_sent_as_another_content_type_says_so(server, auth):
    """A JSON body sent as text/plain was "Input should be a valid dictionary or object"."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1})
    resp = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**auth, "Content-Type": "text/plain"}
    )
    assert resp.status_code == 400 and "Content-Type: application/json, not text/plain" in resp.text, (
        resp.text
    )
    ok = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert ok.status_code == 200, ok.text
    # none at all (`requests.post(url, data=json.dumps(...))`): "Input should be a valid
    # dictionary or object" too, on every route that takes a body
    for route in (COMPLETIONS, "/v1/chat/completions", "/generate", "/tokenize"):
        resp = httpx.post(f"{server.url}{route}", content=body, headers=auth)
        assert resp.status_code == 400, (route, resp.text)
        assert resp.json()["error"]["message"] == (
            "the request body must be JSON sent as Content-Type: application/json, and the request "
            "has no Content-Type"
        ), (route, resp.text)


def test_a_compressed_body_is_a_415_saying_to_send_it_uncompressed(server, auth):
    """A gzip body with its Content-Encoding was a 400 "There was an error parsing the body"."""
    body = json.dumps({"prompt": "hi", "max_tokens": 1}).encode()
    headers = {**auth, "Content-Type": "application/json"}
    for encoding in ("gzip", "br"):
        resp = httpx.post(
            f"{server.url}{COMPLETIONS}",
            content=gzip.compress(body),
            headers={**headers, "Content-Encoding": encoding},
        )
        assert resp.status_code == 415, resp.text
        assert resp.headers["accept-encoding"] == "identity"
        error = resp.json()["error"]
        assert error["code"] == "unsupported_content_encoding", error
        assert (
            f"compressed request bodies are not supported (Content-Encoding: {encoding})" in error["message"]
        )
        assert "send the body uncompressed" in error["message"], error
    plain = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**headers, "Content-Encoding": "identity"}
    )
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize(
    ("body", "offset"),
    [
        (b'{"prompt": "hi \xff\xfe", "max_tokens": 1}', 15),
        (gzip.compress(b'{"prompt": "hi"}'), 1),
        (b"\xff\xfe{", 0),
        (b'\xff\xfe{"prompt": "hi"}', 0),  # decoded as UTF-16, into text that is not JSON
    ],
    ids=["latin-1", "gzip-without-its-header", "utf-16-byte-order-mark", "utf-16-byte-order-mark-even"],
)
def test_a_body_not_in_utf8_says_so(server, auth, body, offset):
    """Bytes that are not UTF-8 were a 400 "There was an error parsing the body". A UTF-16
    byte-order mark made the JSON decoder read UTF-16, whose error (an odd byte count) named byte
    0x7b at offset 2."""
    resp = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error", error
    assert error["message"].startswith(
        f"the request body is not valid UTF-8 (byte 0x{body[offset]:02x} at offset {offset})"
    )
    assert "send the JSON encoded as UTF-8" in error["message"], error


def test_a_body_of_nul_bytes_says_it_is_not_json(server, auth):
    """NUL bytes are UTF-8, but make the JSON decoder read UTF-16 (or 32): no UTF-8 offset to name."""
    body = '{"prompt": "hi"}'.encode("utf-16-le")[:-1]
    resp = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message.startswith("the request body is not valid JSON: its NUL bytes read as utf-16"), message
    assert "send the JSON encoded as UTF-8" in message


def test_a_long_model_name_is_not_echoed_whole(server, auth):
    """A megabyte of model name came back whole in the 404's message."""
    resp = httpx.post(f"{server.url}{CHAT}", headers=auth, json={"messages": USER, "model": "m" * 1_000_000})
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model", resp.text[:300]
    assert len(resp.content) < 1000 and "'" + "m" * 200 + "'..." in resp.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "words"),
    CASES,
    ids=[f"{i}-{c[0].rsplit('/', 1)[-1]}" for i, c in enumerate(CASES)],
)
def test_bad_input_is_rejected_and_server_stays_healthy(server, auth, path, body, status, param, words):
    url = f"{server.url}{path}"
    if isinstance(body, str):
        resp = httpx.post(url, content=body, headers={**auth, "Content-Type": "application/json"})
    else:
        resp = httpx.post(url, json=body, headers=auth)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status == 400 else "not_found_error")
    assert error["param"] == param, error
    assert words.lower() in error["message"].lower(), error
    # the next good request still succeeds
    good = httpx.post(
        f"{server.url}{CHAT}", headers=auth, json={"messages": USER, "max_tokens": 2, "temperature": 0}
    )
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": [{"role": "user", "content": LONG}]}, "messages"),  # by its tokens
        (CHAT, {"messages": USER, "max_tokens": 100000}, "max_tokens"),
        (COMPLETIONS, {"prompt": [5] * 3000, "max_tokens": 1}, "prompt"),
    ],
)
def test_a_request_past_the_context_says_context_length_exceeded(server, auth, path, body, param):
    """OpenAI's code for a prompt and max_tokens past the context: the tokenizer's count gave
    none (null) where the API server's count by characters gave it."""
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == param, error
    assert "context length" in error["message"], error


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            CHAT,
            {"messages": USER, "max_tokens": 2.0, "n": 1.0, "seed": 7.0, "top_k": 5.0, "ignore_eos": True},
        ),
        (COMPLETIONS, {"prompt": [5.0, 6], "max_tokens": 2.0, "top_p": 1, "ignore_eos": True}),
        (
            "/generate",
            {"input_ids": [5.0, 6], "sampling_params": {"max_new_tokens": 2.0, "ignore_eos": True}},
        ),
    ],
)
def test_integral_numbers_count_as_integers(server, auth, path, body):
    """JSON has one kind of number: 2.0 is the integer 2 (as vLLM reads it), and an integer is a
    valid float: the request runs as if it had said 2."""
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    tokens = (
        out["meta_info"]["completion_tokens"] if path == "/generate" else out["usage"]["completion_tokens"]
    )
    assert tokens == 2


def test_null_fields_mean_not_set(server, auth):
    body = {
        "messages": USER,
        "max_tokens": 3,
        "temperature": None,
        "tools": None,
        "logit_bias": None,
        "user": "u1",
    }
    resp = httpx.post(f"{server.url}{CHAT}", json=body, headers=auth)
    assert resp.status_code == 200, resp.text


def test_a_body_nested_too_deep_is_named(server, auth):
    """JSON nested 100,000 deep (the decoder's RecursionError) was FastAPI's bare "There was an
    error parsing the body"; now it says what is wrong, as any other malformed body."""
    body = b'{"prompt": "hi", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = httpx.post(
        f"{server.url}{COMPLETIONS}", content=body, headers={**auth, "content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("malformed JSON body: nested deeper"), resp.text


def test_rejections_are_counted(server, auth, read_metrics):
    before = read_metrics()["minisgl_requests_rejected_total"]
    httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": LONG}, headers=auth)
    assert read_metrics()["minisgl_requests_rejected_total"] == before + 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        # refused once its prompt is tokenized (its length decides), after admission
        ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": 1000}),
        # the first prompt of the batch was admitted before the second was found too long
        (COMPLETIONS, {"prompt": ["hi", LONG], "max_tokens": 2}),
    ],
)
def test_a_request_refused_after_admission_is_counted_as_rejected_only(
    server, auth, read_metrics, path, body
):
    """Its admitted prompts are withdrawn: /metrics counted them as client aborts and their prompt
    tokens as accepted, so one refusal showed as a rejection, an abort and served tokens."""
    before = read_metrics()
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    after = read_metrics()
    for name, grew in [
        ("minisgl_requests_rejected_total", 1),
        ('minisgl_requests_total{finish_reason="abort"}', 0),
        ("minisgl_prompt_tokens_total", 0),
    ]:
        assert after[name] - before[name] == grew, name


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": ["a", "b"]}, "prompt"),
        ("/tokenize", {"messages": [USER, USER]}, "messages"),
        # a list of any shape (empty, of token ids or their lists)
        ("/tokenize", {"prompt": []}, "prompt"),
        ("/tokenize", {"prompt": [5, 6]}, "prompt"),
    ],
)
def test_a_batch_on_a_native_route_says_to_send_one_prompt_a_request(server, auth, path, body, param):
    """/tokenize's batch was "prompt: Input should be a valid string, not an array", which did not
    say that batches are what this route does not take, nor what to do instead; an empty list, or
    one of token ids, still was. (/generate takes SGLang's batch: tests/server/test_generate_batch.py)"""
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_field", error
    assert f"batched input is not supported on {path}" in error["message"], error
    assert "send one request per prompt" in error["message"], error


BIG = "x" * 100_000
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BIG_VALUES = [
    # (body, the param the 400 names): each echoed the client's whole value in its message
    ({"messages": USER, "service_tier": BIG}, "service_tier"),
    ({"messages": USER, "modalities": [BIG]}, "modalities"),
    ({"messages": [{"role": BIG, "content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": [{"type": BIG, "text": "hi"}]}]}, "messages.0.content"),
    ({"messages": USER, BIG: 1}, None),
    (
        {"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": BIG}}},
        "tool_choice",
    ),
    (
        {
            "messages": USER,
            "tools": [{"type": "function", "function": {"name": BIG, "parameters": {"type": BIG}}}],
        },
        "tools",
    ),
]


@pytest.mark.parametrize(("body", "param"), BIG_VALUES, ids=[p or "field-name" for _, p in BIG_VALUES])
def test_a_long_value_refused_is_not_echoed_whole(server, auth, body, param):
    """A 100,000-character value refused came back whole in the 400's message (service_tier, a
    role, a field's name, ...): now cut to a few dozen characters, still naming the field."""
    resp = httpx.post(f"{server.url}{CHAT}", headers=auth, json=body)
    assert resp.status_code == 400, resp.text[:300]
    error = resp.json()["error"]
    assert len(error["message"]) < 600 and "x" * 60 in error["message"], error["message"][:700]
    if param is not None:
        assert error["param"] is not None and error["param"].startswith(param), error


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"service_tier": 5}, "service_tier", "invalid_value"),  # one of a Literal's values
        ({"modalities": "text"}, "modalities", "invalid_type"),
        ({"max_tokens": "many"}, "max_tokens", "invalid_type"),
        ({"temperature": [1]}, "temperature", "invalid_type"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
    ],
)
def test_a_value_of_the_wrong_type_or_choice_has_openais_code(server, auth, extra, param, code):
    """Pydantic's type and choice checks answered with code null; OpenAI's API says invalid_type /
    invalid_value, which a client can branch on."""
    resp = httpx.post(f"{server.url}{CHAT}", headers=auth, json={"messages": USER, **extra})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and error["code"] == code, error

"""A 400 names the field as the client's body spells it, in its param and in its message: the
messages are built with SamplingParams' and admission's names (max_tokens, min_tokens, prompt)."""

from __future__ import annotations

import re

import httpx
import pytest

USER = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GENERATE = "/generate"


def refusal(server, auth, path: str, body: dict) -> dict:
    resp = httpx.post(f"{server.url}{path}", json=body, headers=auth, timeout=120)
    assert resp.status_code == 400, resp.text
    return resp.json()["error"]


def words(message: str) -> set[str]:
    """The field-like words of a message (sampling_params.max_new_tokens whole)."""
    return set(re.findall(r"[\w.]*\w", message))


@pytest.mark.parametrize(
    ("path", "body", "param", "named", "not_named"),
    [
        (
            GENERATE,
            {"text": "hi", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}},
            "sampling_params.min_new_tokens",
            "sampling_params.max_new_tokens (2)",
            {"max_tokens", "min_tokens"},
        ),
        (
            CHAT,
            {"messages": USER, "max_completion_tokens": 5, "min_tokens": 6},
            "min_tokens",
            "max_completion_tokens (5)",
            {"max_tokens"},
        ),
        (
            CHAT,
            {"messages": USER, "max_completion_tokens": 9000},
            "max_completion_tokens",
            "max_completion_tokens (9000)",
            {"max_tokens"},
        ),
        (
            GENERATE,
            {"text": "hi", "sampling_params": {"max_new_tokens": 9000}},
            "sampling_params.max_new_tokens",
            "sampling_params.max_new_tokens (9000)",
            {"max_tokens"},
        ),
        # the OpenAI spelling stays as it was
        (CHAT, {"messages": USER, "max_tokens": 9000}, "max_tokens", "max_tokens (9000)", set()),
    ],
)
def test_output_length_errors_name_the_field_sent(server, auth, path, body, param, named, not_named):
    error = refusal(server, auth, path, body)
    assert error["param"] == param, error
    assert named in error["message"], error
    assert not words(error["message"]) & not_named, error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (GENERATE, {"text": ""}, "text"),
        (GENERATE, {"input_ids": []}, "input_ids"),
        (COMPLETIONS, {"prompt": ["hi", ""]}, "prompt.1"),
        (COMPLETIONS, {"prompt": [[5, 6], []]}, "prompt.1"),
    ],
)
def test_an_empty_prompt_is_named_as_sent(server, auth, path, body, param):
    error = refusal(server, auth, path, body)
    assert (error["param"], error["message"]) == (param, f"{param} is empty"), error


def test_a_prompt_of_a_list_too_long_is_named_by_its_path(server, auth):
    """It said "shorten the prompt.1" (a helper's probe): an element is named by its path alone;
    a plain field keeps its article."""
    error = refusal(server, auth, COMPLETIONS, {"prompt": [[5, 6], [5] * 3000], "max_tokens": 2})
    assert (error["param"], error["code"]) == ("prompt.1", "context_length_exceeded"), error
    assert error["message"].startswith("prompt.1 (3000 tokens) + max_tokens (2) = 3002 exceeds"), error
    assert error["message"].endswith("; shorten prompt.1 or lower max_tokens"), error
    error = refusal(
        server, auth, GENERATE, {"input_ids": [5] * 3000, "sampling_params": {"max_new_tokens": 2}}
    )
    assert error["message"].endswith("; shorten the input_ids or lower sampling_params.max_new_tokens"), error


def test_tokenize_of_no_messages_blames_messages(server, auth):
    error = refusal(server, auth, "/tokenize", {"messages": []})
    assert error["param"] == "messages", error


def test_score_only_echo_of_a_full_context_says_it_needs_one_token(server, auth):
    """echo with max_tokens 0 generates one token and drops it: a prompt as long as the context
    (2048 here) is refused saying so, not as max_tokens (1), which the client never sent."""
    body = {"prompt": [5] * 2048, "echo": True, "max_tokens": 0}
    error = refusal(server, auth, COMPLETIONS, body)
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded"), error
    assert "max_tokens 0" in error["message"] and "at most 2047 tokens" in error["message"], error
    assert "max_tokens (1)" not in error["message"], error
    # one token shorter is scored
    resp = httpx.post(
        f"{server.url}{COMPLETIONS}", json={**body, "prompt": [5] * 2047}, headers=auth, timeout=300
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 0


@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_an_engine_refusal_on_generate_names_min_new_tokens(server, auth, batch):
    """The engine's 400 (min_new_tokens bans every stop token, and the stop tokens are the whole
    vocabulary: no token is left) named min_tokens, the engine's name, in its param and its
    message, where /generate's body says sampling_params.min_new_tokens."""
    info = httpx.get(f"{server.url}/get_model_info", headers=auth, timeout=30).json()
    runs_dry = {"max_new_tokens": 3, "min_new_tokens": 2, "stop_token_ids": list(range(info["vocab_size"]))}
    if batch:  # (each prompt its own sampling_params: the second's are named by its index)
        body = {"text": ["hi", "ho"], "sampling_params": [{"max_new_tokens": 2}, runs_dry]}
        param = "sampling_params.1.min_new_tokens"
    else:
        body, param = {"text": "hi", "sampling_params": runs_dry}, "sampling_params.min_new_tokens"
    error = refusal(server, auth, GENERATE, body)
    assert error["param"] == param, error
    assert error["message"].startswith("no token is left to sample after 0 output token(s)"), error
    assert param in error["message"] and "min_tokens" not in words(error["message"]), error

"""A grammar that takes long to compile holds up no other request (it compiles off the
scheduler's thread) and, past ``--grammar-compile-timeout``, fails with a 400 naming the flag."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

USER = [{"role": "user", "content": "fill the form"}]
#: xgrammar 0.2 takes about 17 s to compile it for the tiny model on one thread (2.5 s at 1,000
#: properties, superlinear), far past the server's limit below
HEAVY = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
HEAVY_FORMAT = {"type": "json_schema", "json_schema": {"name": "form", "schema": HEAVY}}


@pytest.fixture(scope="module")
def limited(start_server, model_dir, engine_args):
    return start_server(
        ["--model", str(model_dir), "--grammar-compile-timeout", "2", *engine_args],
        env={"MINISGL_XGRAMMAR_THREADS": "1"},
    )


def test_a_grammar_compiling_for_long_holds_up_nobody_and_times_out_as_a_400(limited, model_name):
    client = openai.OpenAI(base_url=f"{limited.url}/v1", api_key="unused", max_retries=0, timeout=120)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        heavy = pool.submit(
            client.chat.completions.create,
            model=model_name, messages=USER, response_format=HEAVY_FORMAT, max_tokens=20,
        )  # fmt: skip
        time.sleep(0.5)  # its compile has begun
        t0 = time.monotonic()
        plain = client.completions.create(model=model_name, prompt="hello", max_tokens=8, temperature=0)
        plain_seconds = time.monotonic() - t0
        with pytest.raises(openai.BadRequestError) as refused:
            heavy.result()
        heavy_seconds = time.monotonic() - started
    # the scheduler kept stepping while the grammar compiled (before: it waited the whole compile)
    assert plain.usage.completion_tokens == 8 and plain_seconds < 5, plain_seconds
    body = refused.value.body
    assert "--grammar-compile-timeout" in body["message"] and body["type"] == "invalid_request_error"
    assert 2 <= heavy_seconds < 10, heavy_seconds
    # the same grammar again while its compile still runs: it waits for that compile, and times out
    # as well; streamed, the status line is out already, so the 400 comes as an event
    with httpx.stream(
        "POST",
        f"{limited.url}/v1/chat/completions",
        json={"model": model_name, "messages": USER, "response_format": HEAVY_FORMAT, "stream": True},
        timeout=60,
    ) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert len(errors) == 1 and errors[0]["type"] == "invalid_request_error", events
    assert "--grammar-compile-timeout" in errors[0]["message"] and events[-1] == "[DONE]"
    assert httpx.get(f"{limited.url}/health", timeout=10).status_code == 200


def test_the_timeout_flag_refuses_what_is_not_seconds(tmp_path):
    from minisgl_core.testing.cli_runner import run_cli

    for bad in ("-1", "nan", "inf", "soon"):
        proc = run_cli(["serve", "--grammar-compile-timeout", bad, "--model", str(tmp_path)], timeout=60)
        assert proc.returncode == 2 and "--grammar-compile-timeout" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_a_large_grammar_no_text_can_begin_is_a_400_from_the_engine(limited, model_name):
    """Admission compiles only small grammars against the 256 bytes (for 2,000 properties that
    took the tokenizer process 20 s, every request waiting behind it); a large one that allows no
    first token fails at its first step instead, still as a 400 naming the cause. (Its reference
    to itself sits in a one-branch anyOf: xgrammar 0.2.9 refuses a bare ``$ref`` chain back to
    itself at compile, "Circular $ref chain with no schema content"; both versions compile this
    one into a grammar that allows nothing. It is made large by definitions nothing uses: keywords
    beside the anyOf would be refused before that, as xgrammar drops them.)"""
    big_self_ref = {
        "anyOf": [{"$ref": "#"}],
        "$defs": {f"p{i}": {"type": "string"} for i in range(400)},
    }
    client = openai.OpenAI(base_url=f"{limited.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=USER, max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "loop", "schema": big_self_ref}},
        )  # fmt: skip
    assert "no token can begin it" in refused.value.body["message"]
    # a large schema with a reference admitted without the byte compile: nobody waits on it
    heavy_ref = {**HEAVY, "$defs": {"n": {"type": "integer"}}, "required": ["n"]}
    heavy_ref["properties"] = {**HEAVY["properties"], "n": {"$ref": "#/$defs/n"}}
    with ThreadPoolExecutor(1) as pool:
        heavy = pool.submit(
            client.chat.completions.create, model=model_name, messages=USER, max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "form", "schema": heavy_ref}},
        )  # fmt: skip
        time.sleep(0.5)
        t0 = time.monotonic()
        plain = client.completions.create(model=model_name, prompt="hello", max_tokens=8, temperature=0)
        assert time.monotonic() - t0 < 5 and plain.usage.completion_tokens == 8
        with pytest.raises(openai.BadRequestError) as overran:  # its compile overran the server's 2 s
            heavy.result()
    # (the engine's 400 names the field that set the grammar, as admission's do; it had param null)
    assert overran.value.body["param"] == "response_format", overran.value.body


def test_a_schema_too_costly_to_compile_is_a_400_at_once(limited, model_name):
    """An object of 5,000 optional properties: xgrammar's compile would take minutes and gigabytes
    of the scheduler's memory, which it kept using past the timeout's 400 (a compile cannot be
    stopped); it is refused at admission, naming the fix, and the server serves on."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(5000)}}
    client = openai.OpenAI(base_url=f"{limited.url}/v1", api_key="unused", max_retries=0, timeout=60)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=USER, max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "form", "schema": schema}},
        )  # fmt: skip
    assert time.monotonic() - started < 10
    body = refused.value.body
    assert "5,000 in the object at #" in body["message"] and "'required'" in body["message"], body
    assert body["type"] == "invalid_request_error" and body["param"] == "response_format", body
    plain = client.completions.create(model=model_name, prompt="hello", max_tokens=4, temperature=0)
    assert plain.usage.completion_tokens == 4

"""vLLM's request ``priority`` through the server: taken with ``--policy priority`` (and it reaches
the scheduler: a more urgent request queued later runs first), refused with a 400 naming the field
and the fix by a server whose policy ignores priorities (as vLLM's without ``--scheduling-policy
priority``), bad values refused everywhere; SGLang's ``/generate`` priority runs larger first."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from minisgl_core.demo.factories import make_model_dir

from .conftest import API_KEY, metrics

#: the served context: room for a blocking request that runs until the test closes it (2,000
#: tokens in a 2,048 context ended before three requests had queued behind it on a loaded CI run)
CONTEXT = 32768


@pytest.fixture(scope="module")
def priority_server(start_server, tmp_path_factory, engine_args):
    # the session's tiny model (its name too), with a longer context
    model_dir = make_model_dir(
        tmp_path_factory.mktemp("long") / "tiny-qwen3",
        "Qwen3ForCausalLM",
        seed=1,
        max_position_embeddings=CONTEXT,
    )
    # (the last --max-running-requests wins: one request runs at a time, the rest queue)
    return start_server(
        ["--model", str(model_dir), "--api-key", API_KEY, *engine_args, "--policy", "priority",
         "--max-running-requests", "1", "--max-context-len", str(CONTEXT), "--num-kv-tokens", str(2 * CONTEXT)]
    )  # fmt: skip


def openai_client(server, async_: bool = False):
    make = openai.AsyncOpenAI if async_ else openai.OpenAI
    return make(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.url}{route}", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    )


def test_a_priority_is_taken_with_the_priority_policy(priority_server, model_name):
    client = openai_client(priority_server)
    chat = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_body={"priority": -5, "ignore_eos": True},
    )  # fmt: skip
    assert chat.usage.completion_tokens == 3
    completion = client.completions.create(
        model=model_name, prompt="hello", max_tokens=3, extra_body={"priority": 2**63 - 1, "ignore_eos": True}
    )
    assert completion.usage.completion_tokens == 3
    native = post(
        priority_server,
        "/generate",
        {"text": "hello", "priority": 5, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}},
    )
    assert native.status_code == 200, native.text
    assert native.json()["meta_info"]["completion_tokens"] == 2
    response = client.responses.create(
        model=model_name, input="hi", max_output_tokens=3, temperature=0, extra_body={"priority": -(2**63)}
    )
    assert response.usage.output_tokens == 3


def test_a_priority_is_refused_where_the_policy_ignores_it(client, model_name, server):
    """The session's server runs prefill-first, the default."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            extra_body={"priority": -5},
        )  # fmt: skip
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == "priority", error
    assert "this server runs --policy prefill-first; start it with --policy priority" in error["message"]
    assert "vLLM's --scheduling-policy priority" in error["message"]
    with pytest.raises(openai.BadRequestError, match="--policy priority"):
        client.completions.create(model=model_name, prompt="hello", max_tokens=3, extra_body={"priority": 1})
    with pytest.raises(openai.BadRequestError, match="--policy priority") as refused:
        client.responses.create(model=model_name, input="hi", max_output_tokens=3, extra_body={"priority": 1})
    assert refused.value.body["param"] == "priority"
    native = post(server, "/generate", {"text": "hello", "priority": 1})
    assert native.status_code == 400 and native.json()["error"]["param"] == "priority", native.text
    # 0, every request's default, is what the policy does anyway
    taken = client.completions.create(
        model=model_name, prompt="hello", max_tokens=2, extra_body={"priority": 0, "ignore_eos": True}
    )
    assert taken.usage.completion_tokens == 2


@pytest.mark.parametrize("value", ["high", "1", True, 2**64, 2**63, -(2**63) - 1, 1.5, [1]])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate"])
def test_a_priority_that_is_no_64_bit_integer_is_refused(priority_server, route, value):
    """(null is "not set", as for every field: priority 0)"""
    body = {
        "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2},
        "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    }[route]
    resp = post(priority_server, route, {**body, "priority": value})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "priority", resp.text


def test_sglangs_most_negative_priority_has_no_negation(priority_server):
    """/generate's priority runs larger values first: the engine gets its negation, which -2**63
    does not have in 64 bits."""
    resp = post(priority_server, "/generate", {"text": "hi", "priority": -(2**63)})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "priority", resp.text
    assert (
        post(
            priority_server,
            "/generate",
            {"text": "hi", "priority": 1 - 2**63, "sampling_params": {"max_new_tokens": 1}},
        ).status_code
        == 200
    )


def test_a_more_urgent_request_queued_later_runs_first(priority_server, model_name):
    """One request slot, held by a long streamed request; a less urgent request, then a more urgent
    one, queue behind it. When the stream is closed (its request aborted), the more urgent one is
    admitted first. Each route's priority: the chat one's vLLM's, /generate's SGLang's (larger
    first: its 3 runs before vLLM's 1, after vLLM's -7). The order is that of each request's first
    streamed token, which the next admitted cannot produce before the one ahead has made all 64
    of its own (the order the answers completed in at the client could swap two short ones whose
    deliveries overlapped: seen once in CI)."""

    async def run() -> list[str]:
        client = openai_client(priority_server, async_=True)
        started: list[str] = []

        async def chat(name: str, priority: int) -> None:
            stream = await client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": name}], max_tokens=64, stream=True,
                extra_body={"priority": priority, "ignore_eos": True},
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content and name not in started:
                    started.append(name)

        async def generate(name: str, priority: int) -> None:
            body = {
                "text": name,
                "priority": priority,
                "stream": True,
                "sampling_params": {"max_new_tokens": 64, "ignore_eos": True},
            }
            headers = {"Authorization": f"Bearer {API_KEY}"}
            async with httpx.AsyncClient(timeout=120) as http:
                async with http.stream(
                    "POST", f"{priority_server.url}/generate", json=body, headers=headers
                ) as resp:
                    assert resp.status_code == 200
                    async for line in resp.aiter_lines():
                        if line.startswith("data: {") and name not in started:
                            started.append(name)

        blocker = await client.completions.create(
            model=model_name,
            prompt="go",
            max_tokens=CONTEXT - 100,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        await anext(aiter(blocker))  # it runs: the one slot is taken
        queued = []
        for count, start in enumerate(
            [chat("late-low", 1), generate("sglang-mid", 3), chat("urgent", -7)], start=1
        ):
            queued.append(asyncio.create_task(start))
            # the scheduler has it queued before the next one is sent: arrival order as listed
            deadline = time.monotonic() + 30
            while metrics(priority_server.url).get("minisgl_num_requests_waiting") != count:
                assert time.monotonic() < deadline, "the long request ended before the others queued"
                await asyncio.sleep(0.05)
        await blocker.close()  # the slot frees
        await asyncio.gather(*queued)
        return started

    assert asyncio.run(run()) == ["urgent", "sglang-mid", "late-low"]

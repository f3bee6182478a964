"""Tool-call round trip on a real model (not collected by pytest; run by hand where the weights are).

Starts ``minisgl serve --tool-call-parser hermes --reasoning-parser qwen3`` (plus any extra
arguments, e.g. ``--grammar-backend xgrammar``) on a Qwen3 checkpoint and, through the official
``openai`` client, streaming and not: asks with ``tools``, forces a call with a named
``tool_choice`` (the grammar makes the arguments follow the schema), checks them with
``jsonschema``, answers with a ``tool`` message and reads the final answer; also once with
``tool_choice`` "auto" and thinking on, to see the parsers on the model's own format. Writes
``$OUT/tool_check.json`` and the server log; exits non-zero when a check fails.

    python3 tests/server/device_tool_check.py --model /models/Qwen3-0.6B [-- --grammar-backend xgrammar]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from minisgl_core.testing.live_server import LiveServer

OUT = Path(os.environ.get("OUT", "/tmp/out"))
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather like in Paris today? Use celsius."}]


def start(model: str, extra: list[str]) -> LiveServer:
    args = ["--model", model, "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3", *extra]
    workdir = Path(tempfile.mkdtemp(prefix="tool-check-"))
    return LiveServer(workdir, args, log_path=OUT / "tool_check_server.log")


def call_and_answer(client, model: str, stream: bool) -> dict:
    import jsonschema

    named = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = dict(
        model=model, messages=ASK, tools=[WEATHER], tool_choice=named, max_tokens=128, temperature=0
    )
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        pieces: dict[int, dict] = {}
        for chunk in chunks:
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                entry = pieces.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
                entry["arguments"] += d.function.arguments or ""
        calls = [pieces[i] for i in sorted(pieces)]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        message = client.chat.completions.create(**kwargs).choices[0]
        finish = [message.finish_reason]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in message.message.tool_calls or []
        ]
    assert finish == ["tool_calls"], finish
    assert [c["name"] for c in calls] == ["get_weather"], calls
    arguments = json.loads(calls[0]["arguments"])
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0]["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0]["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 degrees celsius, sunny"},
    ]
    final = client.chat.completions.create(
        model=model,
        messages=history,
        tools=[WEATHER],
        max_tokens=256,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    answer = final.choices[0].message.content or ""
    assert answer.strip(), final
    return {"arguments": arguments, "answer": answer, "finish": final.choices[0].finish_reason}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("extra", nargs="*", help="more `minisgl serve` arguments (after --)")
    args = parser.parse_args()
    import openai

    OUT.mkdir(parents=True, exist_ok=True)
    server = start(args.model, args.extra)
    name = Path(args.model).name
    result: dict = {}
    try:
        url = server.wait_ready(timeout=600)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
        for stream in (False, True):
            result[f"forced_stream={stream}"] = call_and_answer(client, name, stream)
        auto = client.chat.completions.create(
            model=name, messages=ASK, tools=[WEATHER], max_tokens=1024, temperature=0
        ).choices[0]
        result["auto"] = {
            "finish": auto.finish_reason,
            "reasoning_content": getattr(auto.message, "reasoning_content", None),
            "content": auto.message.content,
            "tool_calls": [c.model_dump() for c in auto.message.tool_calls or []],
        }
    finally:
        server.proc.terminate()
        try:
            server.wait_exit(60)
        finally:
            server.kill_all()
        (OUT / "tool_check.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

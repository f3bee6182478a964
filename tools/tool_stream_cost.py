"""API-server time to stream one long tool call through the tool parsers, a few characters a
piece (as a model writes it token by token), against parsing the same text whole once: a
stream's cost should grow with the call's length, not with its square (every piece used to read
the call again from its start). One JSON line per parser and size:

    .venv/bin/python tools/tool_stream_cost.py [--sizes 14000,56000] [--piece 4]

Runs on the CPU, no model: the parsers alone, and the chat pipeline's ``ChoiceOutput`` (hermes
with the qwen3 reasoning parser) that the server runs per choice."""

from __future__ import annotations

import argparse
import json
import time


def texts(size: int) -> dict[str, str]:
    """Each format's call whose arguments hold about ``size`` characters of code."""
    args = json.dumps({"code": "x = 1\n" * (size // 7)})
    return {
        "hermes": '<tool_call>\n{"name": "f", "arguments": ' + args + "}\n</tool_call>",
        "mistral_v11": "[TOOL_CALLS]f[ARGS]" + args,
        "mistral_v3": '[TOOL_CALLS] [{"name": "f", "arguments": ' + args + "}]",
        "chat_output": '<think>plan</think>\n<tool_call>\n{"name": "f", "arguments": '
        + args
        + "}\n</tool_call>",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="14000,56000", help="comma-separated argument sizes in characters")
    p.add_argument("--piece", type=int, default=4, help="characters fed a piece")
    args = p.parse_args()
    from minisgl_plugin_hermes.parser import HermesToolParser
    from minisgl_plugin_mistral.parser import MistralToolParser
    from minisgl_plugin_qwen3_reasoning.parser import Qwen3ReasoningParser

    from minisgl_core.server.chat_output import ChoiceOutput
    from minisgl_core.server.tools import ToolPlan

    for size in (int(s) for s in args.sizes.split(",")):
        for name, text in texts(size).items():
            if name == "chat_output":
                make = lambda: ChoiceOutput(ToolPlan(HermesToolParser, []), Qwen3ReasoningParser)  # noqa: E731
                feed, end, whole = (
                    (lambda o, t: o.delta(t, final=False)),
                    (lambda o: o.delta("", final=True)),
                    None,
                )
            else:
                cls = HermesToolParser if name == "hermes" else MistralToolParser
                make, feed, end = (lambda cls=cls: cls([])), (lambda o, t: o.feed(t)), (lambda o: o.finish())
                started = time.perf_counter()
                make().parse(text)
                whole = time.perf_counter() - started
            parser = make()
            started = time.perf_counter()
            for i in range(0, len(text), args.piece):
                feed(parser, text[i : i + args.piece])
            end(parser)
            streamed = time.perf_counter() - started
            print(
                json.dumps(
                    {
                        "parser": name,
                        "chars": len(text),
                        "piece": args.piece,
                        "streamed_s": round(streamed, 4),
                        "whole_parse_s": None if whole is None else round(whole, 4),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()

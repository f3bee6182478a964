"""Hermes-style tool calls, as Qwen2.5 / Qwen3 and the Hermes models write them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, anywhere in the output, with plain content around them.
"""

from minisgl_core.api import JsonToolCallParser


class HermesToolParser(JsonToolCallParser):
    call_open = "<tool_call>"
    call_close = "</tool_call>"
    # Hermes' format says "arguments"; a model that writes Llama's "parameters" kept its call
    # with the arguments dropped ("{}", the no-argument call's): both are read
    arguments_keys = ("arguments", "parameters")

"""Mistral tool calls as Mistral's v3 tokenizer (mistral-common) has the model write them
(Mistral-7B-Instruct-v0.3, Mixtral-8x22B-Instruct, Mistral-Nemo): the answer is one JSON array
of calls after the special token ``[TOOL_CALLS]``,

    [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]

the marker optional (a special token: gone from the text when special tokens are skipped, a
request's default). An answer that does not open with the array is plain content.
"""

from minisgl_core.api import JsonToolCallParser


class MistralToolParser(JsonToolCallParser):
    leading_only = True
    lead_markers = ("[TOOL_CALLS]",)
    list_open = "["
    list_close = "]"
    separator = ","

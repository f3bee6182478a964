"""Llama 3.1 / 3.2 JSON tool calls: the whole answer is the call (or several, joined by ``;``),

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

the ``<|python_tag|>`` optional (it is a special token, gone when special tokens are skipped).
An answer that does not open with a call object is plain content.
"""

from minisgl_core.api import JsonToolCallParser


class Llama3JsonToolParser(JsonToolCallParser):
    leading_only = True
    lead_markers = ("<|python_tag|>",)
    separator = ";"
    # Meta's template asks for "parameters"; models fine-tuned on OpenAI data write "arguments".
    arguments_keys = ("parameters", "arguments")

"""Entry point of the Qwen3 reasoning parser (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_reasoning_parsers(register):
    register("qwen3", "minisgl_plugin_qwen3_reasoning.parser:Qwen3ReasoningParser")
    # vLLM's and SGLang's name: the same tags, but DeepSeek-R1 and its Qwen2/Llama distills open
    # <think> in the prompt, so an answer without one begins inside the reasoning
    register("deepseek_r1", "minisgl_plugin_qwen3_reasoning.parser:DeepSeekR1ReasoningParser")

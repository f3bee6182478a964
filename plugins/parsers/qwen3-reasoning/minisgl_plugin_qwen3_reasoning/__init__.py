"""Entry point of the Qwen3 reasoning parser (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_reasoning_parsers(register):
    register("qwen3", "minisgl_plugin_qwen3_reasoning.parser:Qwen3ReasoningParser")
    # vLLM's and SGLang's name for the same tags (DeepSeek-R1 and its Qwen2/Llama distills, whose
    # template opens <think> in the prompt: the server reads the answer as beginning inside it)
    register("deepseek_r1", "minisgl_plugin_qwen3_reasoning.parser:Qwen3ReasoningParser")

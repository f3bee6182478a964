"""Registers LlamaForCausalLM and MistralForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_models(register) -> None:
    register("LlamaForCausalLM", "minisgl_plugin_llama.model:LlamaForCausalLM")
    register("MistralForCausalLM", "minisgl_plugin_llama.model:MistralForCausalLM")

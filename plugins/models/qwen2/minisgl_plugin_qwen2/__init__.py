"""Registers Qwen2ForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_models(register) -> None:
    register("Qwen2ForCausalLM", "minisgl_plugin_qwen2.model:Qwen2ForCausalLM")

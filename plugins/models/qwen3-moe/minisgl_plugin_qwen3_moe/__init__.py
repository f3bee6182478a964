"""Registers Qwen3MoeForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.1"


@hookimpl
def minisgl_register_models(register) -> None:
    register("Qwen3MoeForCausalLM", "minisgl_plugin_qwen3_moe.model:Qwen3MoeForCausalLM")

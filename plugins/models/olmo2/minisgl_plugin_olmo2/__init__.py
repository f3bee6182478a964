"""Registers Olmo2ForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_models(register) -> None:
    register("Olmo2ForCausalLM", "minisgl_plugin_olmo2.model:Olmo2ForCausalLM")

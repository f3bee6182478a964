"""Registers GraniteForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.0"


@hookimpl
def minisgl_register_models(register) -> None:
    register("GraniteForCausalLM", "minisgl_plugin_granite.model:GraniteForCausalLM")

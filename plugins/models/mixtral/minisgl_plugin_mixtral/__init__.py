"""Registers MixtralForCausalLM; the model class is imported only when a model of that architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.1"


@hookimpl
def minisgl_register_models(register) -> None:
    register("MixtralForCausalLM", "minisgl_plugin_mixtral.model:MixtralForCausalLM")

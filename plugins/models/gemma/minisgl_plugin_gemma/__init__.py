"""Registers GemmaForCausalLM and Gemma2ForCausalLM; the model classes are imported only when a
model of either architecture loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.6"  # Gemma 2's attention soft-cap: KVSpec.logits_soft_cap (API 2.6)


@hookimpl
def minisgl_register_models(register) -> None:
    register("GemmaForCausalLM", "minisgl_plugin_gemma.model:GemmaForCausalLM")
    register("Gemma2ForCausalLM", "minisgl_plugin_gemma.model:Gemma2ForCausalLM")

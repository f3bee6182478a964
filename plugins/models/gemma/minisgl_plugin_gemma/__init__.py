"""Registers GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM and
Gemma3ForConditionalGeneration (text-only); the model classes are imported only when a model of
one of them loads."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.8"  # Gemma 3's config read through DecoderForCausalLM.read_config (API 2.8)


@hookimpl
def minisgl_register_models(register) -> None:
    register("GemmaForCausalLM", "minisgl_plugin_gemma.model:GemmaForCausalLM")
    register("Gemma2ForCausalLM", "minisgl_plugin_gemma.model:Gemma2ForCausalLM")
    register("Gemma3ForCausalLM", "minisgl_plugin_gemma.model:Gemma3ForCausalLM")
    # Gemma 3's multimodal checkpoints (4B and up), served text-only
    register("Gemma3ForConditionalGeneration", "minisgl_plugin_gemma.model:Gemma3ForConditionalGeneration")

"""minisgl: a small, plugin-based LLM inference serving engine."""

from minisgl_core.sampling import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # LLM pulls in torch and the engine: import it on first use so `minisgl plugins` stays quick.
    if name in ("LLM", "CompletionOutput", "RequestOutput"):
        from minisgl_core import llm

        return getattr(llm, name)
    raise AttributeError(name)

"""minisgl: a small, plugin-based LLM inference serving engine."""

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "__version__"]


def __getattr__(name: str):
    # SamplingParams too is imported on first use: the ``minisgl`` command's entry point
    # (minisgl_core.entry) imports this package before it can take a Ctrl-C, so the less it runs
    # first, the shorter the time in which a Ctrl-C is a KeyboardInterrupt traceback (on a loaded
    # CI machine one 0.2 s after start landed in this import).
    if name == "SamplingParams":
        from minisgl_core.sampling import SamplingParams

        return SamplingParams
    # LLM pulls in torch and the engine: import it on first use so `minisgl plugins` stays quick.
    if name in ("LLM", "CompletionOutput", "RequestOutput"):
        from minisgl_core import llm

        return getattr(llm, name)
    raise AttributeError(name)

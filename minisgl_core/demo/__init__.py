"""Tiny random models and tokenizers built locally: the embedded demo model the server and ``LLM``
use when no model is given, and the factories the tests and benchmarks build on.
``minisgl_core.testing`` re-exports them for plugin authors."""

"""The multi-process OpenAI-compatible server: launcher, API app, shell and the child-process plumbing."""

"""The OpenAI-compatible HTTP server: launcher, FastAPI app, routes, metrics and the shell."""

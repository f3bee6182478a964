"""Whether a request can ever run under an engine's limits.

Plain Python on purpose: the tokenizer process checks requests with it and must start without
importing torch."""

from __future__ import annotations

from minisgl_core.sampling import SamplingParams


def check_request_fits(
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_context_len: int,
    kv_capacity_tokens: int,
) -> None:
    """Raise ValueError when a request can never run with these limits.

    Shared by :meth:`~minisgl_core.engine.engine.Engine.check_request` and the server's tokenizer
    worker, which checks requests against the limits of the ready handshake before they reach a
    scheduler."""
    if not prompt_ids:
        raise ValueError("prompt is empty")
    if any(not isinstance(t, int) or t < 0 or t >= vocab_size for t in prompt_ids):
        raise ValueError(f"prompt token ids must be integers in [0, {vocab_size})")
    if any(t >= vocab_size for t in params.stop_token_ids):
        raise ValueError(f"stop_token_ids must be integers in [0, {vocab_size}), the model's vocabulary")
    if any(t >= vocab_size for t in params.logit_bias):
        raise ValueError(f"logit_bias token ids must be in [0, {vocab_size})")
    total = len(prompt_ids) + params.max_tokens
    if total > max_context_len:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} exceeds "
            f"the context length {max_context_len}; shorten the prompt or lower max_tokens"
        )
    if total > kv_capacity_tokens:
        raise ValueError(
            f"prompt + max_tokens = {total} tokens exceeds the KV pool ({kv_capacity_tokens} tokens)"
        )

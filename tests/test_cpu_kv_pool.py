"""The KV pool's default size on a CPU: what the run can use, within a share of the free memory.
A fixed 65,536 tokens asked 14 GiB for Qwen3-0.6B in float32, so README's CPU benchmark command
(`minisgl bench offline --shape qwen3-0.6b --num-requests 8`) was refused on a machine with 7.3 GiB
free; an explicit num_kv_tokens is still checked against the memory as before."""

from __future__ import annotations

import pytest

from minisgl_core import LLM, SamplingParams
from minisgl_core.config import CPU_DEFAULT_KV_TOKENS, ConfigError
from minisgl_core.runner import model_runner
from minisgl_core.testing import make_model_dir

#: the tiny model's KV bytes per token: 2 layers x K,V x 2 KV heads x 16 dims x 4 bytes (float32)
PER_TOKEN = 2 * 2 * 2 * 16 * 4
#: its max_position_embeddings, the default max_context_len
CONTEXT = 2048


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("m") / "llama", "LlamaForCausalLM")


def pool_with(model_dir, monkeypatch, free: int | None, **options) -> int:
    """The pool's size (tokens) of an LLM built on a CPU with ``free`` bytes free, after a request ran."""
    monkeypatch.setattr(model_runner, "free_bytes", lambda device: free)
    with LLM(model_dir, attn="torch", device="cpu", **options) as llm:
        assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2
        return llm.engine.kv_capacity_tokens


def test_with_memory_to_spare_the_cpu_pool_is_as_before_or_what_the_run_can_use(model_dir, monkeypatch):
    assert pool_with(model_dir, monkeypatch, 1 << 40) == CPU_DEFAULT_KV_TOKENS
    assert pool_with(model_dir, monkeypatch, None) == CPU_DEFAULT_KV_TOKENS  # (free memory unknown)
    # 4 requests of 2,048 tokens at most cannot use more
    assert pool_with(model_dir, monkeypatch, 1 << 40, max_running_requests=4) == 4 * CONTEXT


def test_the_cpu_pool_takes_half_the_free_memory_at_most(model_dir, monkeypatch):
    free = CPU_DEFAULT_KV_TOKENS * PER_TOKEN // 4  # the old default pool asked for 4x this: refused
    assert pool_with(model_dir, monkeypatch, free) == CPU_DEFAULT_KV_TOKENS // 8


def test_the_cpu_pool_holds_one_longest_request_where_the_memory_does(model_dir, monkeypatch):
    # (one request row: the request tables take next to nothing of the memory)
    # half the free memory holds 1,365 tokens, 80% of it a whole 2,048-token context
    free = CONTEXT * PER_TOKEN * 4 // 3
    assert pool_with(model_dir, monkeypatch, free, max_running_requests=1) == CONTEXT
    # where it does not, half of it, and requests are limited to that (as a GPU's small pool)
    free = CONTEXT * PER_TOKEN
    assert pool_with(model_dir, monkeypatch, free, max_running_requests=1) == CONTEXT // 2


def test_an_explicit_num_kv_tokens_is_still_checked_against_the_memory(model_dir, monkeypatch):
    monkeypatch.setattr(model_runner, "free_bytes", lambda device: CPU_DEFAULT_KV_TOKENS * PER_TOKEN // 4)
    with pytest.raises(
        ConfigError, match=r"^num_kv_tokens=65536 \(the KV pool\) asks for .* free on cpu: lower"
    ):
        LLM(model_dir, attn="torch", device="cpu", num_kv_tokens=CPU_DEFAULT_KV_TOKENS)

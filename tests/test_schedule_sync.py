"""On CUDA the engine plans a step while the device still runs the one before it (overlap
scheduling), so nothing the scheduler does may wait for the device: a synchronizing call there (a
plain host-to-device copy waits for every queued kernel) makes each step wait for the previous
one. PyTorch's sync debug mode raises at any such call inside ``schedule()``, over prompts that
finish their prefill (offered to the prefix cache, their page-table row pointed at its copy) and
later prompts that hit that cache (the reused prefix written into their row). CUDA only."""

from __future__ import annotations

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.llm import LLM

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_schedule_never_waits_for_the_device(tmp_path):
    model_dir = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    llm = LLM(model_dir, device="cuda", dtype="bfloat16", attn="torch", max_prefill_tokens=256, page_size=16)
    scheduler = llm.engine.scheduler
    plain = scheduler.schedule
    planned = []

    def strict(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            batch = plain(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        planned.append(None if batch is None else batch.kind)
        return batch

    scheduler.schedule = strict
    shared = list(range(3, 99))  # six whole pages
    prompts = [shared + [200 + i] * 5 for i in range(4)]
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0)
    llm.generate(prompts[:2], params, use_tqdm=False)
    hits_before = scheduler.kv.cached_tokens
    llm.generate(prompts[2:], params, use_tqdm=False)
    assert scheduler.kv.cached_tokens > hits_before  # the second round reused the cached prefix
    assert "prefill" in planned and "decode" in planned

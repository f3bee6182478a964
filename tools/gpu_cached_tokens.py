"""GPU check of per-request cached_tokens (session 94) and of emptying the prefix cache (session
95): the same prompt twice under overlap and CUDA graphs, the second reading whole pages from the
radix cache; then ``LLM.reset_prefix_cache()`` and the prompt again, computed whole, to the same
greedy tokens; a flush under a running request refused."""

from minisgl_core import LLM, SamplingParams
from minisgl_core.testing import drain

sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
prompt = list(range(100, 180))  # 80 tokens
with LLM("demo", device="cuda") as llm:
    first = llm.generate([prompt], sp, use_tqdm=False)[0]
    second = llm.generate([prompt], sp, use_tqdm=False)[0]
    print("page size", llm.engine.config.page_size if hasattr(llm.engine, "config") else "?")
    print("cached", first.num_cached_tokens, second.num_cached_tokens, "of", len(prompt))
    print("same tokens", first.token_ids == second.token_ids)
    assert first.num_cached_tokens == 0 and 0 < second.num_cached_tokens < len(prompt)
    print("GPU_CACHED_OK")
    assert llm.reset_prefix_cache() is True
    print("after reset", tuple(llm.engine.scheduler.kv.size_info()))
    third = llm.generate([prompt], sp, use_tqdm=False)[0]
    print("cached after reset", third.num_cached_tokens, "same tokens", third.token_ids == first.token_ids)
    assert third.num_cached_tokens == 0 and third.token_ids == first.token_ids
    llm.engine.add_request(99, prompt, sp)
    assert llm.engine.flush_cache() is None  # a request runs: refused
    drain(llm.engine)
    freed = llm.engine.flush_cache()
    print("freed when idle", freed)
    assert freed is not None and freed > 0
    print("GPU_FLUSH_OK")

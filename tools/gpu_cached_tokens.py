"""GPU check of per-request cached_tokens (session 94): the same prompt twice under overlap and
CUDA graphs; the second reads whole pages from the radix cache."""

from minisgl_core import LLM, SamplingParams

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

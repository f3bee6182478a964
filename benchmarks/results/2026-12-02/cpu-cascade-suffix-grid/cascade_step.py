import time, torch
from minisgl_core import LLM
from minisgl_core.sampling import SamplingParams
import sys
with LLM(attn="torch", **({"cascade": False} if len(sys.argv) > 1 else {})) as llm:
    prefix = [1 + (j * 13) % 4000 for j in range(760)]
    prompts = [prefix + [100 + i, 200 + i, 300 + i] for i in range(35)]
    g = lambda n: llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    g(2)
    t = time.perf_counter(); g(4); a = time.perf_counter() - t
    t = time.perf_counter(); g(12); b = time.perf_counter() - t
    print("decode ms/step", (b - a) / 8 * 1e3)
    print("STEP", (b - a) / 8 * 1e3, flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as p:
        g(6)
    sys.exit(0)
    ka=[e for e in p.key_averages(group_by_input_shape=True) if e.key!="threading.py(331): wait"]
    ka.sort(key=lambda e:-e.self_cpu_time_total)
    for e in ka[:12]: print(f"{e.key:32s} {e.count:6d} {e.self_cpu_time_total/1e3:9.1f} ms", str(e.input_shapes)[:110])

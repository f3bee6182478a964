import os, time, sys, random, statistics
from minisgl_core import SamplingParams
from minisgl_core.llm import LLM
llm = LLM(os.path.expanduser("~/.cache/minisgl/SmolLM2-135M-Instruct"), device="cpu")
random.seed(0)
p = SamplingParams(max_tokens=1, temperature=0.0)
ts = []
for i in range(4):
    prompt = [random.randint(100, 40000) for _ in range(1000)]
    t = time.perf_counter(); llm.generate([prompt], p, use_tqdm=False); ts.append(time.perf_counter() - t)
print(os.environ.get("MINISGL_CPU_ONEDNN_GEMM"), "1000-token prefill s:", [round(x, 3) for x in ts], "median of last 3", round(statistics.median(ts[1:]), 3))

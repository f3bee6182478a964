"""A/B on a CPU machine: `minisgl serve` (the default model, --device cpu) with OpenMP's default
spin-wait vs OMP_WAIT_POLICY=PASSIVE in the server's processes; `bench serve` (shared-prefix, CPU
sized: 4 groups x 4 prompts, 256-token prefix, 32-token question, 64 output tokens, concurrency 8)
against each, alternating, each server a fresh process tree.

    .venv/bin/python tools/cpu_omp_ab.py WORKDIR ROUNDS [spin,passive,nice]   # results: WORKDIR/ab.jsonl
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from minisgl_core.testing.live_server import LiveServer

work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
rounds = int(sys.argv[2])
#: which variants (default: spin,passive); "nice": the default spin-wait with the scheduler
#: process's threads at nice 5
chosen = (sys.argv[3] if len(sys.argv) > 3 else "spin,passive").split(",")
VARIANTS = [
    v
    for v in (("spin (default)", {}), ("PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}), ("nice 5 scheduler", {}))
    if v[0].split()[0].lower() in chosen
]
for r in range(rounds):
    for label, env in VARIANTS:
        s = LiveServer(work / f"s{r}-{label.split()[0]}", ["--device", "cpu"], env)
        s.wait_ready(300)
        if label.startswith("nice"):  # the scheduler process yields the cores to the others
            for pid in s.children():
                if Path(f"/proc/{pid}/comm").read_text().startswith("minisgl-sched"):
                    for tid in os.listdir(f"/proc/{pid}/task"):
                        os.setpriority(os.PRIO_PROCESS, int(tid), 5)
        out = work / "ab.jsonl"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "minisgl_core",
                "bench",
                "serve",
                "--url",
                s.url,
                "--workload",
                "shared-prefix",
                "--groups",
                "4",
                "--prompts-per-group",
                "4",
                "--prefix-len",
                "256",
                "--question-len",
                "32",
                "--output-len",
                "64",
                "--concurrency",
                "8",
                "--label",
                f"{label} r{r + 1}",
                "--output",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        d = json.loads(out.read_text().splitlines()[-1])
        print(
            label,
            f"r{r + 1}",
            {k: d[k] for k in d if k.endswith(("p50", "p99")) or "tok_per_s" in k},
            flush=True,
        )
        s.proc.terminate()
        s.proc.wait(60)

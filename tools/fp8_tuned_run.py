"""Run ``python3 -m minisgl_core ARGS`` with the fp8 GEMV's launch configurations taken from a
``tools/device_fp8_check.py gemm --sweep`` or ``tools/device_gemv_sweep.py`` report (the fastest correct configuration of each swept
Llama-3.1-8B layer shape; ``pick_config`` for any other shape), to measure a choice end to end before
it goes into ``pick_config``. TP=1 only (the engine runs in this process).

    python3 tools/fp8_tuned_run.py SWEEP.json bench offline --model M --quantization fp8 --decode-latency
"""

from __future__ import annotations

import json
import runpy
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])


def tuned_configs(report_path: str) -> dict[tuple[int, int], dict]:
    """The fastest correct configuration per swept shape, from a ``device_fp8_check.py gemm
    --sweep`` report or a ``device_gemv_sweep.py`` one."""
    from device_fp8_check import LLAMA_8B_LINEARS

    report = json.load(open(report_path))
    if "layers" in report:  # tools/device_gemv_sweep.py
        return {(row["n"], row["k"]): row["best"][0]["config"] for row in report["layers"] if row["best"]}
    shapes = report["gemm"]["shapes"]
    picked = {}
    for name, n, k in LLAMA_8B_LINEARS:
        sweep = shapes.get(name, {}).get("gemv", {}).get("m1", {}).get("sweep")
        good = [t for t in (sweep or {}).get("best", []) if t.get("rel_err", 1.0) < 0.05]
        if good:
            picked[(n, k)] = good[0]["config"]
    return picked


def main() -> None:
    report, args = sys.argv[1], sys.argv[2:]
    from minisgl_plugin_fp8 import gemv

    table = tuned_configs(report)
    default = gemv.pick_config

    def pick_config(n: int, k: int, sm_count: int = 132) -> gemv.GemvConfig:
        config = table.get((n, k))
        return gemv.GemvConfig(**config) if config else default(n, k, sm_count)

    gemv.pick_config = pick_config
    print(
        "fp8 GEMV configurations:",
        json.dumps({f"{n}x{k}": c for (n, k), c in table.items()}),
        file=sys.stderr,
    )
    sys.argv = ["minisgl_core", *args]
    runpy.run_module("minisgl_core", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

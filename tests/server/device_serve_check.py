"""GPU check of the server (not collected by pytest; run by hand on a machine with 2 GPUs).

Starts ``minisgl serve`` with --tp 1 and --tp 2 (NCCL) on a small random Qwen3, sends greedy and
64 concurrent streaming requests, checks that TP 2 equals TP 1, that idle ranks do not spin and
that SIGTERM leaves no process behind. Writes ``$OUT/serve_check.json`` and the server logs.

    source .whl/prelude.sh && python3 tests/server/device_serve_check.py [--bf16]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from minisgl_core.testing.live_server import LiveServer

OUT = Path(os.environ.get("OUT", "/tmp/out"))
PROMPTS = [f"Prompt {i}: tell me about {'the sea ' * (i % 5)}and the sky" for i in range(64)]


def serve(model: str, tp: int, extra: list[str]) -> dict:
    server = LiveServer(
        Path(tempfile.mkdtemp(prefix="serve-check-")),
        ["--model", model, "--tp", str(tp), *extra],
        log_path=OUT / f"serve-tp{tp}-{extra[1]}.log",
    )
    try:
        return check(server, model)
    finally:
        if server.proc.poll() is None:
            server.kill_all()


def check(server: LiveServer, model: str) -> dict:
    import openai

    started = time.monotonic()
    url = server.wait_ready(timeout=300)
    result: dict = {"ready_s": round(time.monotonic() - started, 1)}
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    greedy = client.completions.create(
        model=Path(model).name, prompt=PROMPTS[:4], max_tokens=16, temperature=0
    )
    result["greedy"] = [c.text for c in greedy.choices]

    async def stream_all() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)

        async def one(prompt: str) -> str:
            text = ""
            async for chunk in await aclient.completions.create(
                model=Path(model).name, prompt=prompt, max_tokens=32, temperature=0, stream=True
            ):
                text += chunk.choices[0].text
            return text

        return await asyncio.gather(*(one(p) for p in PROMPTS))

    t = time.monotonic()
    result["concurrent"] = asyncio.run(stream_all())
    result["concurrent_s"] = round(time.monotonic() - t, 2)
    kids = server.children()
    time.sleep(1.0)
    before = server.cpu_seconds(server.running(kids))
    time.sleep(3.0)
    result["idle_cpu_s_over_3s"] = round(server.cpu_seconds(server.running(kids)) - before, 3)
    server.proc.send_signal(signal.SIGTERM)
    t = time.monotonic()
    result["exit_code"] = server.wait_exit(60)
    result["stop_s"] = round(time.monotonic() - t, 2)
    time.sleep(1.0)
    result["children_left"] = server.running(kids)
    result["log_tail"] = server.log().splitlines()[-3:]
    return result


def main() -> None:
    from minisgl_core.demo.factories import make_model_dir

    OUT.mkdir(parents=True, exist_ok=True)
    model = str(
        make_model_dir(
            "/tmp/m/qwen3-small",
            "Qwen3ForCausalLM",
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=32,
            intermediate_size=512,
        )
    )
    fp32 = ["--dtype", "float32", "--attn", "torch", "--device", "cuda"]
    report: dict = {}
    configs = [("tp1", 1, fp32), ("tp2", 2, fp32)]
    if "--bf16" in sys.argv:  # also the GPU attention plugins (their first use JIT-compiles for minutes)
        configs.append(("tp2_bf16_auto", 2, ["--dtype", "bfloat16"]))
    for name, tp, args in configs:
        try:
            report[name] = serve(model, tp, args)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next configuration
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
    report["tp2_equals_tp1_greedy"] = report["tp1"].get("greedy") == report["tp2"].get("greedy")
    report["tp2_equals_tp1_concurrent"] = report["tp1"].get("concurrent") == report["tp2"].get("concurrent")
    (OUT / "serve_check.json").write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report.items() if not isinstance(v, dict)}
    for name, _, _ in configs:
        summary[name] = {k: v for k, v in report[name].items() if k not in ("greedy", "concurrent")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

"""GPU check of grammars in a server: a grammar that compiles for long holds up nobody and fails
past ``--grammar-compile-timeout``; a large grammar no text can begin is a 400; constrained
outputs parse as their schema says (CUDA graphs and overlap on, the server's defaults).

    python3 tools/device_grammar_serve.py [--model DIR] [--out FILE]   # one JSON line; exit 1 on failure

Without --model the Qwen3-0.6B shape (random weights) is written to /tmp/m first. About a
minute after the server is up (it starts with a 5 s compile limit).

The GPU machine's wheel set (``../shared/device/fetch-wheels.sh``) has no grammar library: carry
xgrammar with the others, or every constrained request is a 400 ("xgrammar is not installed")::

    .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_28_x86_64 -d .dev/w2 xgrammar==0.2.8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from minisgl_core.testing.grammar_suite import NESTED_SCHEMA
from minisgl_core.testing.live_server import LiveServer

USER = [{"role": "user", "content": "describe a pet"}]


def form(n: int, tag: str) -> dict:
    return {"type": "object", "properties": {f"{tag}{i}": {"type": "string"} for i in range(n)}}


def _validate(value: object) -> None:
    """jsonschema's check where it is installed (the GPU machine has none: parsing must do)."""
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(value, NESTED_SCHEMA)


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


async def checks(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:
        model = (await c.get("/v1/models")).json()["data"][0]["id"]

        async def chat(max_tokens: int = 32, **extra) -> tuple[int, float, dict]:
            started = time.monotonic()
            body = {"model": model, "messages": USER, "max_tokens": max_tokens, **extra}
            r = await c.post("/v1/chat/completions", json=body)
            return r.status_code, time.monotonic() - started, r.json()

        result: dict = {}
        status, seconds, body = await chat(300, response_format=fmt(NESTED_SCHEMA), n=8, seed=1)
        outs = [ch["message"]["content"] for ch in body.get("choices", []) if ch["finish_reason"] == "stop"]
        for text in outs:
            _validate(json.loads(text))
        result["schema"] = {"status": status, "seconds": round(seconds, 2), "valid_stops": len(outs)}
        plain_alone = await asyncio.gather(*[chat() for _ in range(32)])
        heavy = asyncio.ensure_future(chat(response_format=fmt(form(5000, "h"))))
        await asyncio.sleep(0.3)
        plain = await asyncio.gather(*[chat() for _ in range(32)])
        h_status, h_seconds, h_body = await heavy
        result["plain_alone_max_s"] = round(max(p[1] for p in plain_alone), 3)
        result["plain_beside_compile_max_s"] = round(max(p[1] for p in plain), 3)
        result["plain_statuses"] = sorted({p[0] for p in plain + plain_alone})
        result["heavy"] = {
            "status": h_status,
            "seconds": round(h_seconds, 2),
            "error": h_body.get("error", {}).get("message"),
        }
        loop = {"$ref": "#", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}
        l_status, _, l_body = await chat(response_format=fmt(loop))
        result["self_ref"] = {"status": l_status, "error": l_body.get("error", {}).get("message")}
        result["health"] = (await c.get("/health")).status_code
        result["ok"] = (
            status == 200
            and len(outs) >= 1
            and result["plain_statuses"] == [200]
            and h_status == 400
            and "--grammar-compile-timeout" in (result["heavy"]["error"] or "")
            and l_status == 400
            and result["health"] == 200
        )
        return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model")
    p.add_argument("--out")
    args = p.parse_args()
    model = args.model
    if model is None:
        model = "/tmp/m/qwen3-0.6b"
        if not Path(model, "config.json").exists():
            make = [sys.executable, "-m", "minisgl_core", "bench", "make-model", "--shape", "qwen3-0.6b"]
            subprocess.run([*make, "--out", model, "--device", "cuda"], check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="grammar-serve-"))
    log = Path(args.out).with_suffix(".log") if args.out else work / "server.log"
    server = LiveServer(work, ["--model", model, "--grammar-compile-timeout", "5"], log_path=log)
    try:
        server.wait_ready(timeout=600)
        result = asyncio.run(checks(server.url))
    finally:
        server.kill_all()
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
